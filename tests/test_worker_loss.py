"""A lost worker costs seconds: a worker SIGKILLed during a model call, a
tool call or a compensation is noticed by the activity's heartbeat timeout
(5 s by default, not its start-to-close timeout) and the next worker runs it
again. A tool or compensation that writes in the call journal's transaction
and is killed before the commit leaves neither its effect nor its record;
the next attempt runs it again. (A worker that gets SIGTERM:
tests/test_worker_shutdown.py.)

Every assertion is on the turn's history (which attempt ran, why the one
before it ended) and the database, never on wall time."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client

from tests.support.services import POLICY_SNIPPET, side_effects
from tests.support.sql import fetchall
from tests.support.turns import local_activities
from tests.support.waiting import wait_until
from tests.support.worker_loss import (
    HangingReply,
    ProcessTurns,
    activity_runs,
    after_heartbeat_timeout,
    ledger_status,
    notes,
)
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import CALL_MODEL, COMPENSATE_TOOL, EXECUTE_TOOL
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.specs import DEFAULT_HEARTBEAT_SECONDS
from turnstile.sales import truth
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.testing.processes import DevServer


@pytest.fixture
def turns(client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
          fake_llm: FakeOpenAIServer) -> ProcessTurns:
    return ProcessTurns(client, temporal_server, task_queue, tmp_path, fake_llm.url)


@pytest.fixture
def db_turns(client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
             fake_llm: FakeOpenAIServer, db: Database) -> ProcessTurns:
    """Turns on a subprocess worker against `db`: SQLite and PostgreSQL."""
    side_effects(db)  # the test tools' table, made before any journal transaction
    return ProcessTurns(client, temporal_server, task_queue, tmp_path, fake_llm.url, db.url)


async def test_worker_killed_during_model_call(turns: ProcessTurns,
                                               fake_llm: FakeOpenAIServer) -> None:
    hang = HangingReply()
    fake_llm.script(hang, text_reply("answered by the second worker"))
    wf_id = f"kill-model-{turns.task_queue}"
    first = turns.worker("worker1")
    try:
        handle = await turns.start(wf_id, "hello")
        await wait_until(hang.entered.is_set, timeout=30, what="the model request never arrived")
    finally:
        first.kill()  # SIGKILL while the model request is open
    second = turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        hang.released.set()
        second.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "answered by the second worker"
    [(scheduled, started)] = await activity_runs(handle, CALL_MODEL)
    attrs = scheduled.activity_task_scheduled_event_attributes
    assert attrs.heartbeat_timeout.ToTimedelta() == timedelta(seconds=DEFAULT_HEARTBEAT_SECONDS)
    assert attrs.start_to_close_timeout.ToTimedelta() == timedelta(seconds=180)
    run = started.activity_task_started_event_attributes
    # The first attempt ended by its heartbeat timeout, the second one answered.
    assert run.attempt == 2
    timeout = run.last_failure.timeout_failure_info
    assert timeout.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT, run.last_failure
    assert len([r for r in fake_llm.requests if "_refused" not in r]) == 2


async def test_worker_killed_while_begin_turn_retrieves(turns: ProcessTurns,
                                                       fake_llm: FakeOpenAIServer) -> None:
    """begin_turn holds the conversation's lock and runs the retriever (steps
    1, 4, 5) inside the turn's first workflow task: a worker SIGKILLed there
    loses that task, which times out; the next worker runs begin_turn again
    (the same run keeps its lock) and the turn ends with one user message,
    augmented, and the conversation released."""
    hold = turns.tmp / "hold"
    hold.touch()
    fake_llm.script(text_reply("answered by the second worker"))
    wf_id = f"kill-begin-{turns.task_queue}"
    first = turns.worker("worker1", TEST_RETRIEVER_HOLD=str(hold))
    try:
        # The lost task times out after 5 s instead of Temporal's 10 s (local
        # activities that run longer keep their task alive by heartbeats).
        handle = await turns.start(wf_id, "How fast do key accounts get a call?",
                                   service="test-retrieval", task_timeout=timedelta(seconds=5))
        await wait_until((turns.tmp / "hold.entered").exists, timeout=30,
                         what="the retriever never ran")
    finally:
        first.kill()  # SIGKILL inside begin_turn, the lock taken, the retriever running
    hold.unlink()
    second = turns.worker("worker2", TEST_RETRIEVER_HOLD=str(hold))
    try:
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        second.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "answered by the second worker"
    history = await handle.fetch_history()
    kinds = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT in kinds  # the lost task
    assert await local_activities(handle) == [
        "turnstile.begin_turn", "turnstile.release_conversation"]  # retrieval rode along
    [request] = [r for r in fake_llm.requests if "_refused" not in r]
    assert POLICY_SNIPPET in request["messages"][1]["content"]
    stored = MemoryStore(turns.db).messages(f"c-{wf_id}")
    assert [m.role for m in stored] == ["system", "user", "assistant"]
    assert POLICY_SNIPPET in str(stored[1].content)
    with turns.db.connect() as conn:
        assert fetchall(conn, "SELECT * FROM conversation_lock") == []


async def test_worker_killed_before_a_journaled_tool_commits(
        db_turns: ProcessTurns, fake_llm: FakeOpenAIServer, tmp_path: Path) -> None:
    """journaledWrite is NOT idempotent; its row commits with the call's record.
    Killed after its INSERT, before the commit: neither is there, and the next
    attempt runs it again — once."""
    wrote = tmp_path / "wrote"
    fake_llm.script(tool_reply(("call-j", "journaledWrite",
                                {"note": "once", "marker": str(wrote), "seconds": 60})),
                    text_reply("done"))
    turns, db = db_turns, db_turns.db
    wf_id = f"kill-journal-{turns.task_queue}"
    first = turns.worker("worker1")
    try:
        handle = await turns.start(wf_id, "go")
        await wait_until(wrote.exists, timeout=30, what="the tool never wrote")
        assert notes(db, wf_id) == []  # written, not committed
    finally:
        first.kill()
    assert notes(db, wf_id) == []
    assert ledger_status(db, wf_id, "call-j") == "STARTED"
    assert [r.status for r in AuditLog(db).rows(wf_id)] == ["INITIATED"]
    second = turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        second.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
    assert notes(db, wf_id) == ["once"]
    assert ledger_status(db, wf_id, "call-j") == "COMPLETED"
    [(scheduled, started)] = await activity_runs(handle, EXECUTE_TOOL)
    after_heartbeat_timeout(scheduled, started)
    assert '"attempt": 2' in fake_llm.requests[-1]["messages"][-1]["content"]
    assert truth.disagreements(db, f"c-{wf_id}") == []


async def test_worker_killed_before_a_journaled_undo_commits(
        db_turns: ProcessTurns, fake_llm: FakeOpenAIServer, tmp_path: Path) -> None:
    """The undo of journaledReserve and its record (memory rewritten, audit
    ROLLED_BACK) commit together: killed in between, neither is there; the
    next attempt undoes it and the turn ends rolled back."""
    undoing = tmp_path / "undoing"
    fake_llm.script(tool_reply(("r1", "journaledReserve",
                                {"item": "hall", "undo_marker": str(undoing)})),
                    tool_reply(("m1", "mustSucceed", {})))
    turns, db = db_turns, db_turns.db
    wf_id, conv = f"kill-journal-undo-{turns.task_queue}", f"c-kill-journal-undo-{turns.task_queue}"
    first = turns.worker("worker1")
    try:
        handle = await turns.start(wf_id, "book")
        await wait_until(undoing.exists, timeout=30, what="the undo never ran")
        assert notes(db, wf_id) == ["hall"]  # CANCELLED written, not committed
    finally:
        first.kill()
    assert notes(db, wf_id) == ["hall"]
    [reserved] = [m for m in MemoryStore(db).messages(conv) if m.tool_call_id == "r1"]
    assert not reserved.attributes.get(attr.ROLLED_BACK)
    second = turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        second.stop()
    assert result.status == TurnStatus.ROLLED_BACK, result.error
    assert result.tool_calls[0].status == CallStatus.ROLLED_BACK
    assert notes(db, wf_id) == ["CANCELLED"]
    [(scheduled, started)] = await activity_runs(handle, COMPENSATE_TOOL)
    after_heartbeat_timeout(scheduled, started)
    [undone] = [m for m in MemoryStore(db).messages(conv) if m.tool_call_id == "r1"]
    assert undone.attributes.get(attr.ROLLED_BACK) and "(attempt 2)" in (undone.content or "")
    assert [r.status for r in AuditLog(db).rows(wf_id)
            if r.tool_name == "journaledReserve"] == ["ROLLED_BACK"]
    assert truth.disagreements(db, conv) == []
