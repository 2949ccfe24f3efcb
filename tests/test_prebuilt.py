"""Statements marked `prebuilt` (turnstile/stores/prebuilt.py) run on
SQLite's driver directly; here every one of them runs both ways, on a
seeded SQLite file, and gives the same rows (same keys, same values, same
types) or the same count of changed rows. Inserts are compared by what they
leave in the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import exc

from tests.support.databases import sqlite_file_url
from turnstile.stores import journal_repair, journal_writes, prebuilt as pb, runs  # noqa: F401 (their statements)
from turnstile.stores.audit import tool_execution_log
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.ledger import LedgerStatus, tool_call_ledger
from turnstile.stores.lock import conversation_lock
from turnstile.stores.memory_tables import GET, chat_message, conversation
from turnstile.stores.message_parts import chat_message_part
from turnstile.stores.superseded import superseded_message
from turnstile.stores.tables import metadata
from turnstile.stores.usage import model_usage

WF, CHAIN, RUN, OLD = "turn-1", "chain-1", "run-2", "run-1"
CALLS = json.dumps([{"id": "call-1", "name": "querySalesData", "arguments": "{}"}])
# Values for every bind name the marked statements use (a name the seed
# does not know fails the test: a new statement must be listed here).
PARAMS: dict[str, Any] = {
    "conv": "c1", "seq": 2, "n": 64, "wf": WF, "chain": CHAIN, "run": RUN, "horizon": 1,
    "first": 1, "last": 3, "through": 0, "conversation_id": "c1", "workflow_id": WF,
    "run_id": RUN, "call": "call-1", "claim": 1, "v_result": "{}", "v_is_error": 0,
    "v_outcome": "completed", "v_state": None, "v_finished_at": "2026-12-05T18:00:00Z",
    "since": 0, "id": "exec-1", "v_status": "SUCCESS", "v_end": "2026-12-05T18:00:01Z",
    "v_error": None,
}


def _seed(conn: sa.Connection) -> None:
    now = "2026-12-05T17:00:00Z"
    conn.execute(sa.insert(conversation), [{"conversation_id": "c1", "user_id": "ann",
                                            "created_at": now, "answered_through": 1}])
    rows = [("system", "be brief", None, None, 0), ("user", "sales 1,000?", None, None, 0),
            ("assistant", "", CALLS, None, 0), ("tool", '{"rows": 3}', None, "call-1", 1),
            ("assistant", "three", None, None, 0)]
    conn.execute(sa.insert(chat_message), [
        {"conversation_id": "c1", "seq": i, "role": role, "content": content,
         "tool_calls": calls, "tool_call_id": call_id, "is_error": err,
         "attributes": json.dumps({"k": i}) if i % 2 else None, "created_at": now,
         "workflow_id": WF, "execution_chain": CHAIN, "run_id": OLD if i == 3 else RUN}
        for i, (role, content, calls, call_id, err) in enumerate(rows)])
    conn.execute(sa.insert(chat_message_part), [{"conversation_id": "c1", "seq": 1, "idx": 0,
                                                 "type": "image_url", "url": "https://x/y.png"}])
    conn.execute(sa.insert(conversation_lock), [{"conversation_id": "c1", "workflow_id": WF,
                                                 "run_id": RUN, "acquired_at": now,
                                                 "execution_chain": CHAIN}])
    conn.execute(sa.insert(superseded_message), [
        {"conversation_id": "c1", "seq": s, "role": "assistant", "content": "",
         "tool_calls": CALLS, "workflow_id": wf, "execution_chain": CHAIN,
         "run_id": OLD, "superseded_by": RUN, "superseded_at": now, "created_at": now}
        for s, wf in ((5, WF), (6, "turn-0"))])
    conn.execute(sa.insert(tool_call_ledger), [{
        "workflow_id": WF, "execution_chain": CHAIN, "tool_call_id": "call-1",
        "tool_name": "querySalesData", "status": LedgerStatus.STARTED.value, "started_at": now}])
    conn.execute(sa.insert(tool_execution_log), [{
        "execution_id": "exec-1", "workflow_id": WF, "conversation_id": "c1",
        "user_id": "ann", "tool_name": "querySalesData", "input_params": "{}",
        "start_time": now, "status": "INITIATED", "execution_chain": CHAIN}])


@pytest.fixture
def seeded(tmp_path: Path) -> Database:
    db = Database(sqlite_file_url(tmp_path / "p.db"))
    metadata.create_all(db.engine)
    with db.engine.begin() as conn:
        _seed(conn)
    return db


def _both(db: Database, stmt: Any, params: dict[str, Any]) -> tuple[Any, Any]:
    """(SQLAlchemy's result, the driver's), each in a transaction rolled back."""
    with db.engine.connect() as sa_conn:
        with sa_conn.begin() as tx:
            result = sa_conn.execute(stmt, params)
            via_sa = ([dict(r) for r in result.mappings()] if result.returns_rows
                      else result.rowcount)
            tx.rollback()
        with sa_conn.begin() as tx:
            form = pb.driver_form(stmt, sa_conn.dialect, params)
            assert form is not None, f"not run on the driver: {stmt}"
            cur = Connection(sa_conn, "sqlite")._run(form, params)
            names = [d[0] for d in cur.description or ()]
            via_driver = ([dict(zip(names, r, strict=True)) for r in cur.fetchall()]
                          if cur.description else cur.rowcount)
            cur.close()
            tx.rollback()
    return via_sa, via_driver


def test_every_marked_read_and_update_gives_what_sqlalchemy_gives(seeded: Database) -> None:
    for horizon in (False, True):  # the claim's shapes, built (and marked) on first use
        for slots in (False, True):
            runs._claim_select(horizon, slots)
    checked = 0
    for stmt in pb.marked():
        if isinstance(stmt, sa.Insert):
            continue  # below
        names = set(stmt.compile(dialect=seeded.engine.dialect).binds)
        params = {k: v for k, v in PARAMS.items() if k in names}
        via_sa, via_driver = _both(seeded, stmt, params)
        assert via_driver == via_sa, stmt
        if isinstance(via_sa, list):
            assert via_sa, f"the seed should give {stmt} a row to read"
            assert [[type(v) for v in r.values()] for r in via_driver] == \
                   [[type(v) for v in r.values()] for r in via_sa]
        else:
            assert via_sa == 1, f"the seed should give {stmt} a row to change"
        checked += 1
    # The statements of a turn's memory, lock, journal and repair.
    assert checked >= 20, checked


def test_inserts_leave_the_same_rows(tmp_path: Path) -> None:
    def run(db: Database, driver: bool) -> list[Any]:
        with db.connect() as conn:
            if not driver:
                conn._form = lambda *_: None  # type: ignore[method-assign]
            first = conn.insert_new(model_usage, {
                "usage_key": "turn-1/run-2/3", "workflow_id": WF, "run_id": RUN,
                "call_seq": 3, "conversation_id": "c1", "user_id": "ann",
                "service": "sales", "model": "m", "person": "ann", "prompt_tokens": 10,
                "completion_tokens": 2, "recorded_at": "2026-12-05T18:00:00Z"})
            again = conn.insert_new(model_usage, {
                "usage_key": "turn-1/run-2/3", "workflow_id": WF, "run_id": RUN,
                "call_seq": 3, "conversation_id": "c1", "user_id": "ann",
                "service": "sales", "model": "m", "person": "ann", "prompt_tokens": 99,
                "completion_tokens": 9, "recorded_at": "2026-12-05T18:00:09Z"})
            rows = conn.sa.execute(sa.select(model_usage)).all()
        return [first, again, [tuple(r) for r in rows]]
    a = Database(sqlite_file_url(tmp_path / "a.db"))
    b = Database(sqlite_file_url(tmp_path / "b.db"))
    for db in (a, b):
        metadata.create_all(db.engine)
    assert run(a, driver=True) == run(b, driver=False)
    assert run(a, driver=True)[:2] == [False, False]  # already there


def test_a_driver_error_is_sqlalchemys(seeded: Database) -> None:
    with pytest.raises(exc.IntegrityError), seeded.connect() as conn:
        conn.insert_new(conversation, {"conversation_id": "c2", "user_id": None,
                                       "created_at": "x"})
    with pytest.raises(exc.ArgumentError), seeded.connect() as conn:
        conn.row(GET, dict, {"conv": "c1"})  # no seq
