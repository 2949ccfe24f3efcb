"""Where activities' own work runs: thread hops cost more than small work
(bench/README.md). `Database.call` runs database work on SQLite at once, on
the event loop's thread; on PostgreSQL, or with TURNSTILE_SQLITE_ON_LOOP=off,
in a worker thread; either way the caller gets the result or the exception.
Turn events go to their listeners at once while only the worker's own
listeners (log line, span) listen, and from a thread once an app's listener
(which may block) is among them."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tests.support.databases import sqlite_file_url
from turnstile.activities.pipeline import deliver
from turnstile.activities.runtime import Runtime
from turnstile.engine.events import TurnStarted
from turnstile.runtime.config import Settings
from turnstile.runtime.event_bus import EventBus
from turnstile.runtime.services import ServiceRegistry
from turnstile.stores.db import Database
from turnstile.stores.transaction import Transaction


def _thread_and_sum(a: int, *, b: int) -> tuple[int, int]:
    return threading.get_ident(), a + b


def _refuse() -> None:
    raise LookupError("no such row")


async def test_call_runs_on_the_loop_on_sqlite_and_in_a_thread_on_postgresql(
        db: Database) -> None:
    here = threading.get_ident()
    thread, total = await db.call(_thread_and_sum, 2, b=3)
    assert total == 5
    if db.dialect == "sqlite":
        assert db.on_loop and thread == here
    else:
        assert not db.on_loop and thread != here
    with pytest.raises(LookupError, match="no such row"):
        await db.call(_refuse)


async def test_sqlite_work_goes_to_a_thread_when_told(tmp_path: Path) -> None:
    db = Database(sqlite_file_url(tmp_path / "t.db"), on_loop=False)
    thread, _ = await db.call(_thread_and_sum, 1, b=1)
    assert not db.on_loop and thread != threading.get_ident()


@pytest.mark.parametrize(("value", "on_loop"), [(None, True), ("on", True), ("off", False),
                                                ("false", False), ("0", False)])
def test_the_setting_reaches_the_runtimes_database(tmp_path: Path, value: str | None,
                                                   on_loop: bool) -> None:
    env = {"DATABASE_URL": sqlite_file_url(tmp_path / "t.db")}
    if value is not None:
        env["TURNSTILE_SQLITE_ON_LOOP"] = value
    settings = Settings.from_env(env)
    assert settings.sqlite_on_loop is on_loop
    rt = Runtime.build(settings, ServiceRegistry([]))
    assert rt.db.on_loop is on_loop


async def test_events_reach_the_own_listeners_at_once_and_an_apps_from_a_thread(
        tmp_path: Path) -> None:
    rt = Runtime.build(Settings.from_env({"DATABASE_URL": sqlite_file_url(tmp_path / "t.db")}),
                       ServiceRegistry([]))
    assert isinstance(rt.events, EventBus) and not rt.events.may_block
    threads: list[int] = []
    rt.events.listeners.append(lambda event: threads.append(threading.get_ident()))
    assert rt.events.may_block
    event = TurnStarted(event_id="w1/r1/turn_started", workflow_id="w1", run_id="r1",
                        conversation_id="c1",
                        user_id="alice", service="s", at="2026-12-05T00:00:00+00:00")
    await deliver(rt, [event])
    assert threads and threads[0] != threading.get_ident()


async def test_while_a_journaled_transaction_is_open_work_hops_to_a_thread(
        tmp_path: Path) -> None:
    """A journaled tool's transaction holds SQLite's write lock, and its
    commit comes from the loop: a write run on the loop meanwhile would wait
    for a lock only the loop can release (seen as parked turns stalling for
    the busy timeout). While it is open, `call` hops to a thread; after, it
    runs on the loop again."""
    db = Database(sqlite_file_url(tmp_path / "t.db"))
    with db.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (n INTEGER)")

    def write(n: int) -> int:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(f"INSERT INTO t VALUES ({n})")
        return threading.get_ident()

    tx = Transaction(db)
    with tx.use() as conn:  # BEGIN IMMEDIATE: the write lock, until commit
        conn.sa.exec_driver_sql("INSERT INTO t VALUES (1)")
    waiting = asyncio.ensure_future(db.call(write, 2))
    await asyncio.sleep(0.3)  # the loop runs meanwhile: the write waits in its thread
    assert not waiting.done()
    tx.commit()
    assert await asyncio.wait_for(waiting, 10) != threading.get_ident()
    assert await db.call(write, 3) == threading.get_ident()  # closed: on the loop again
    with db.engine.connect() as conn:
        assert [r[0] for r in conn.exec_driver_sql("SELECT n FROM t ORDER BY n")] == [1, 2, 3]


async def test_work_on_the_loop_may_open_a_journaled_transaction(tmp_path: Path) -> None:
    """The gate is re-entrant: work `call` runs on the loop holds it, and a
    Transaction it opens there takes it again instead of waiting for itself."""
    db = Database(sqlite_file_url(tmp_path / "t.db"))
    with db.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (n INTEGER)")

    def open_and_commit() -> int:
        tx = Transaction(db)
        with tx.use() as conn:
            conn.sa.exec_driver_sql("INSERT INTO t VALUES (1)")
        tx.commit()
        return threading.get_ident()

    assert await db.call(open_and_commit) == threading.get_ident()
    assert await db.call(open_and_commit) == threading.get_ident()  # closed again: on the loop


async def test_work_on_the_loop_keeps_one_connection_and_a_failed_one_is_replaced(
        tmp_path: Path) -> None:
    """Transactions run on the loop take the connection it keeps (one pool
    checkout for many); a nested one, or one from a thread, takes a pooled
    connection; after a database error the next starts on a fresh one."""
    import sqlalchemy as sa
    from sqlalchemy import event, exc

    db = Database(sqlite_file_url(tmp_path / "t.db"))
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    checkouts: list[int] = []
    event.listen(db.engine, "checkout", lambda *_: checkouts.append(1))

    def insert(k: int) -> None:
        with db.connect() as conn:
            conn.execute(sa.text("INSERT INTO t (k, v) VALUES (:k, 'x')"), {"k": k})

    def nested() -> tuple[int, int]:
        with db.connect() as outer, db.connect() as inner:
            return id(outer.sa), id(inner.sa)

    for k in range(5):
        await db.call(insert, k)
    assert len(checkouts) == 1
    outer, inner = await db.call(nested)
    assert outer != inner and len(checkouts) == 2  # the nested one was pooled
    await asyncio.to_thread(insert, 10)  # not on the loop: pooled
    assert len(checkouts) == 3
    with pytest.raises(exc.IntegrityError):
        await db.call(insert, 1)  # a database error: the kept connection goes
    await db.call(insert, 11)
    assert len(checkouts) == 4
    with db.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM t"), int) == 7
    db.release_kept()
