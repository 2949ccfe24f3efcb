"""The schema compatibility window (turnstile.stores.schema_window): each
migration says whether code of the revision before it runs on it; the
migrator records those marks in the database; code older than the database
runs on it when every newer revision is compatible ("runs on a newer schema
(REVISION)") and refuses with one line naming the revision otherwise (the
worker: exit 2).

The newer revisions here are fixtures written into a migrated database, as a
newer release's migrator would leave it: this code does not have their files,
exactly as an older release does not have the newer release's."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from temporalio.client import Client

from tests.support.schemas import schema_of
from tests.support.temporal_server import DevServer
from tests.support.worker_process import ROOT, WorkerProcess
from turnstile.cli.worker import EXIT_NEWER_SCHEMA
from turnstile.engine.contract import WORKFLOW_TYPE, TurnInput, TurnResult, TurnStatus
from turnstile.stores.db import Database
from turnstile.stores.engines import engine_for
from turnstile.stores.schema import alembic_config, current, head_revision, upgrade
from turnstile.stores.schema_window import MARKER, NewerSchema, declared, schema_revision
from turnstile.testing import FakeOpenAIServer, text_reply

# A revision no release has: what a newer release's migration leaves behind.
FIXTURE = "9901_from_a_newer_release"
FIXTURE_2 = "9902_from_a_newer_release"


def scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def marks() -> dict[str, bool]:
    return {s.revision: declared(s) for s in scripts().walk_revisions()}


def as_if_newer(db: Database, *revisions: tuple[str, bool | None]) -> None:
    """Leave `db` (at this code's head) as a newer release's migrator would:
    each revision recorded after the one before it (compatible or not; None:
    no record, as a release before the window wrote none), alembic_version at
    the last."""
    parent = head_revision()
    with engine_for(db.url).begin() as conn:
        for revision, compatible in revisions:
            if compatible is not None:
                conn.execute(schema_revision.insert().values(
                    revision=revision, down_revision=parent,
                    compatible_with_previous=compatible,
                    recorded_at="2026-12-06T00:00:00.000+00:00"))
            parent = revision
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :r"), {"r": parent})


# -- the marks ------------------------------------------------------------------------

def test_every_migration_declares_whether_older_code_runs_on_it() -> None:
    for script in scripts().walk_revisions():
        value = getattr(script.module, MARKER, None)
        assert isinstance(value, bool), f"{script.revision} declares no {MARKER} = True/False"
    template = (ROOT / "turnstile" / "migrations" / "script.py.mako").read_text()
    assert f"{MARKER} = False" in template  # a new revision starts unmarked-safe


def test_the_marks_say_what_the_revisions_do() -> None:
    # Only 0005 changes what older code uses (two primary keys).
    assert {r for r, ok in marks().items() if not ok} == {"0005"}


def test_a_revision_marked_compatible_only_adds(fresh_url: str) -> None:
    """Each revision marked compatible keeps every table, column (with its
    nullability), key and index of the revision before it, and what it adds is
    nullable or defaulted; the one marked incompatible does change a key."""
    db = Database(fresh_url)
    chain = list(reversed(list(scripts().walk_revisions())))
    upgrade(db, chain[0].revision)
    before = schema_of(db)
    for script in chain[1:]:
        upgrade(db, script.revision)
        after = schema_of(db)
        kept = all(after[t]["pk"] == shape["pk"]
                   and set(shape["columns"]) <= set(after[t]["columns"])
                   and set(shape["indexes"]) <= set(after[t]["indexes"])
                   for t, shape in before.items())
        added = [c for t in after for c in after[t]["columns"]
                 if c not in before.get(t, {"columns": []})["columns"] and t in before]
        nullable_or_defaulted = all(c[2] or c[3] != "none" for c in added)
        assert (kept and nullable_or_defaulted) == declared(script), script.revision
        before = after


def test_the_migrator_records_every_mark_in_the_database(fresh_url: str) -> None:
    db = Database(fresh_url)
    upgrade(db, "0004")
    with engine_for(db.url).connect() as conn:
        rows = {r.revision: (r.down_revision, bool(r.compatible_with_previous))
                for r in conn.execute(sa.select(schema_revision))}
    assert rows == {"0001": ("", True), "0002": ("0001", True), "0003": ("0002", True),
                    "0004": ("0003", True)}
    upgrade(db)
    with engine_for(db.url).connect() as conn:
        recorded = {r.revision: bool(r.compatible_with_previous)
                    for r in conn.execute(sa.select(schema_revision))}
    assert recorded == marks()


# -- older code on a newer schema -----------------------------------------------------

def test_older_code_runs_on_a_newer_compatible_schema_and_migrates_nothing(
        fresh_url: str, caplog: pytest.LogCaptureFixture) -> None:
    db = Database(fresh_url)
    upgrade(db)
    as_if_newer(db, (FIXTURE, True), (FIXTURE_2, True))
    shape = schema_of(db)
    with caplog.at_level(logging.WARNING, "turnstile.stores.schema"):
        assert upgrade(db) == FIXTURE_2
    assert f"runs on a newer schema ({FIXTURE_2})" in caplog.text
    assert FIXTURE in caplog.text and head_revision() in caplog.text
    assert current(db) == FIXTURE_2 and schema_of(db) == shape


@pytest.mark.parametrize("newer", [
    [(FIXTURE, False)],                    # marked incompatible
    [(FIXTURE, True), (FIXTURE_2, False)],  # the second of two is
    [(FIXTURE, False), (FIXTURE_2, True)],  # the first of two is
    [(FIXTURE, None)],                     # no record (a release before the window)
], ids=["incompatible", "second-incompatible", "first-incompatible", "unrecorded"])
def test_older_code_refuses_a_newer_schema_a_revision_of_which_is_not_compatible(
        sqlite_url: str, newer: list[tuple[str, bool | None]]) -> None:
    db = Database(sqlite_url)
    upgrade(db)
    as_if_newer(db, *newer)
    blocking = next(r for r, ok in newer if ok is not True)
    with pytest.raises(NewerSchema) as refused:
        upgrade(db)
    said = str(refused.value)
    assert "\n" not in said and f"revision {blocking} " in said
    assert f"at revision {newer[-1][0]}" in said and head_revision() in said
    assert ("not compatible" in said) == (dict(newer)[blocking] is False)
    assert current(db) == newer[-1][0]  # left as it was


def test_a_lineage_this_code_never_knew_is_refused(sqlite_url: str) -> None:
    db = Database(sqlite_url)
    upgrade(db)
    with engine_for(db.url).begin() as conn:
        conn.execute(schema_revision.insert().values(
            revision="x1", down_revision="", compatible_with_previous=True,
            recorded_at="2026-12-06T00:00:00.000+00:00"))
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'x1'"))
    with pytest.raises(NewerSchema, match="revision x1 has no compatibility record"):
        upgrade(db)


def test_the_operator_command_refuses_in_one_line(sqlite_url: str) -> None:
    db = Database(sqlite_url)
    upgrade(db)
    as_if_newer(db, (FIXTURE, False))
    done = subprocess.run([sys.executable, "-m", "turnstile.db", "upgrade"], cwd=ROOT,
                          env={"DATABASE_URL": sqlite_url, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error:")]  # (and INFO logs)
    assert f"revision {FIXTURE} is marked not compatible" in line
    assert done.stderr.rstrip().endswith(line) and "Traceback" not in done.stderr


def test_stubs_let_a_release_before_the_window_know_compatible_revisions(
        tmp_path: Path) -> None:
    """`python -m turnstile.db stubs DIR` writes, into an older install's
    migrations, a stub of each revision it lacks — only when every one is
    compatible (a stub never makes older code run on a revision that is not)."""
    older = tmp_path / "versions"
    older.mkdir()
    for script in scripts().walk_revisions():
        if script.revision != head_revision():
            (older / Path(script.path).name).write_text(Path(script.path).read_text())

    def stubs() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "turnstile.db", "stubs", str(older)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    done = stubs()
    assert done.returncode == 0, done.stderr
    [stub] = older.glob("*_stub.py")
    assert stub.name == f"{head_revision()}_stub.py"
    namespace: dict[str, object] = {}
    exec(compile(stub.read_text(), str(stub), "exec"), namespace)
    assert namespace["revision"] == head_revision()
    assert namespace["down_revision"] == scripts().get_revision(head_revision()).down_revision
    assert stubs().stdout.startswith("nothing to write")
    # An install that predates 0005 (marked incompatible) gets none.
    for path in older.glob("*.py"):
        if not path.name.startswith(("0001", "0002", "0003", "0004")):
            path.unlink()
    refused = stubs()
    assert refused.returncode == 2 and "revision 0005 is marked not compatible" in refused.stderr
    assert sorted(p.name[:4] for p in older.glob("*.py")) == ["0001", "0002", "0003", "0004"]


# -- the worker -----------------------------------------------------------------------

def worker_env(server: DevServer, url: str, llm_url: str, tmp_path: Path) -> dict[str, str]:
    return {"TEMPORAL_ADDRESS": server.address,
            "TURNSTILE_TASK_QUEUE": f"sw-{uuid.uuid4().hex[:8]}", "DATABASE_URL": url,
            "LLM_BASE_URL": llm_url, "TURNSTILE_DATA_DIR": str(tmp_path / "data")}


async def test_a_worker_refuses_a_newer_incompatible_schema_with_one_line_and_exit_2(
        temporal_server: DevServer, sqlite_url: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    db = Database(sqlite_url)
    upgrade(db)
    as_if_newer(db, (FIXTURE, False))
    log = tmp_path / "refused.log"
    refused = WorkerProcess(log, worker_env(temporal_server, sqlite_url, fake_llm.url, tmp_path))
    with pytest.raises(RuntimeError, match="worker exited"):
        refused.start()
    assert refused.proc is not None and refused.proc.wait(10) == EXIT_NEWER_SCHEMA == 2
    said = [line for line in log.read_text().splitlines() if line.strip()]
    errors = [line for line in said if " ERROR " in line]
    assert len(errors) == 1 and f"revision {FIXTURE} is marked not compatible" in errors[0]
    assert "Traceback" not in log.read_text()
    assert current(db) == FIXTURE


async def test_a_worker_runs_on_a_newer_compatible_schema_and_serves_turns(
        client: Client, temporal_server: DevServer, sqlite_url: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    db = Database(sqlite_url)
    upgrade(db)
    as_if_newer(db, (FIXTURE, True))
    env = worker_env(temporal_server, sqlite_url, fake_llm.url, tmp_path)
    log = tmp_path / "newer.log"
    fake_llm.default = lambda _request: text_reply("hello")
    worker = WorkerProcess(log, env).start()
    try:
        assert f"runs on a newer schema ({FIXTURE})" in log.read_text()
        result = await asyncio.wait_for(client.execute_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id=f"c-{uuid.uuid4().hex[:6]}",
                                     user_id="alice", message="hi", service="sales-assistant"),
            id=f"sw-{uuid.uuid4().hex[:8]}", task_queue=env["TURNSTILE_TASK_QUEUE"],
            result_type=TurnResult), 60)
        assert result.status == TurnStatus.COMPLETED and result.answer == "hello"
    finally:
        worker.stop()
    assert current(db) == FIXTURE  # nothing migrated, nothing rolled back
