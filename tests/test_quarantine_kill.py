"""`python starter.py conversation quarantine C SEQ` SIGKILLed half-way: the
copy into `quarantined_message` and the removal from memory commit together.
The command is a real process, stopped right after its INSERT or its DELETE
(its transaction open: tests/support/holds.py) and killed there: the row is
still in memory and not quarantined; the command run again sets it aside
and it is gone from memory, quarantined once. Never both, never neither. On
SQLite and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import holds
from tests.support.processes import kill_group, spawn
from tests.support.sql import fetchall
from tests.support.waiting import wait_until_sync
from tests.test_damaged_rows import conversation, damage
from turnstile.stores.db import Database
from turnstile.stores.quarantine import damaged_rows

ROOT = Path(__file__).resolve().parents[1]
CONV, SEQ = "c-held", 4


def _where(db: Database) -> tuple[list[int], list[tuple[int, str]]]:
    """The conversation's seqs in memory; its quarantined rows (seq, by)."""
    with db.connect() as conn:
        memory = [r["seq"] for r in fetchall(
            conn, "SELECT seq FROM chat_message WHERE conversation_id = :c ORDER BY seq",
            {"c": CONV})]
        kept = [(r["seq"], r["quarantined_by"]) for r in fetchall(
            conn, "SELECT seq, quarantined_by FROM quarantined_message "
                  "WHERE conversation_id = :c", {"c": CONV})]
    return memory, kept


def _command(db: Database, log: Path, by: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return spawn([sys.executable, "-m", "tests.support.holds", "conversation", "quarantine",
                  CONV, str(SEQ), "--by", by], log, cwd=ROOT,
                 env={**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": db.url, **env})


@pytest.mark.parametrize("after", ["INSERT INTO quarantined_message",
                                   "DELETE FROM chat_message"])
def test_quarantine_killed_before_its_commit(after: str, db: Database, tmp_path: Path) -> None:
    conversation(db, CONV)
    damage(db, CONV, SEQ, "role", "robot")
    hold = tmp_path / "hold"
    hold.touch()
    log = tmp_path / "quarantine.log"
    held = _command(db, log, "ops-1", holds.env(f"after {after}", hold))
    try:
        if not Path(f"{hold}.entered").exists():
            try:
                wait_until_sync(Path(f"{hold}.entered").exists, timeout=30,
                                what=f"the command never ran {after}")
            except AssertionError as never:
                raise AssertionError(log.read_text()[-2000:]) from never
        # Its statement ran, its transaction is open: nothing of it shows.
        assert _where(db) == ([0, 1, 2, 3, 4], [])
    finally:
        kill_group(held)  # SIGKILL
    assert held.returncode == -9
    assert _where(db) == ([0, 1, 2, 3, 4], [])  # still in memory, not quarantined
    assert [(d.conversation_id, d.seq) for d in damaged_rows(db, CONV)] == [(CONV, SEQ)]
    again = _command(db, log, "ops-2", {})
    assert again.wait(timeout=30) == 0, log.read_text()[-2000:]
    assert _where(db) == ([0, 1, 2, 3], [(SEQ, "ops-2")])  # quarantined once, gone
    assert damaged_rows(db, CONV) == []
