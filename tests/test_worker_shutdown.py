"""A worker that gets SIGTERM (a rolling deploy) finishes what it holds
within its grace period, or hands it back, before it exits: a model call or
a journaled tool is handed back and run again by the next worker (failed as
WorkerShutdown, not timed out); a tool that is not safe to run twice is let
finish, or, cut off, settled as interrupted and never run again. (A worker
SIGKILLed: tests/test_worker_loss.py.)

Every assertion is on the turn's history (which attempt ran, why the one
before it ended) and the database, never on wall time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from tests.support.services import side_effects
from tests.support.waiting import wait_until
from tests.support.worker_loss import HangingReply, ProcessTurns, activity_runs, notes
from tests.support.worker_process import WorkerProcess
from turnstile.activities.runtime import WORKER_SHUTDOWN
from turnstile.engine.activity_io import CALL_MODEL, EXECUTE_TOOL
from turnstile.engine.contract import CallStatus, TurnResult, TurnStatus
from turnstile.sales import truth
from turnstile.stores.audit import AuditLog
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.testing.processes import DevServer


@pytest.fixture
def turns(client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
          fake_llm: FakeOpenAIServer) -> ProcessTurns:
    return ProcessTurns(client, temporal_server, task_queue, tmp_path, fake_llm.url)


def sigterm(worker: WorkerProcess, within: float) -> int:
    """SIGTERM the worker and return its exit code (it must exit by itself)."""
    assert worker.proc is not None
    os.killpg(worker.proc.pid, signal.SIGTERM)
    try:
        return worker.proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise


async def test_sigterm_hands_back_a_model_call(turns: ProcessTurns,
                                               fake_llm: FakeOpenAIServer) -> None:
    hang = HangingReply()
    fake_llm.script(hang, text_reply("answered after the handover"))
    wf_id = f"term-model-{turns.task_queue}"
    first = turns.worker("worker1", TURNSTILE_SHUTDOWN_GRACE_SECONDS="1")
    try:
        handle = await turns.start(wf_id, "hello")
        await wait_until(hang.entered.is_set, timeout=30, what="the model request never arrived")
        # The request outlasts the grace period: the worker hands it back and exits.
        assert sigterm(first, within=30) == 0
    finally:
        first.kill()
    second = turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        hang.released.set()
        second.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    [(_, started)] = await activity_runs(handle, CALL_MODEL)
    run = started.activity_task_started_event_attributes
    assert run.attempt == 2
    # Failed by the worker as it shut down, not timed out by the server.
    assert run.last_failure.application_failure_info.type == WORKER_SHUTDOWN, run.last_failure
    assert "worker stopped" in first.log.read_text()


async def sigterm_during_tool(turns: ProcessTurns, wf_id: str, *, grace: str,
                             within: float) -> tuple[WorkflowHandle[Any, TurnResult], TurnResult]:
    """Start the turn, SIGTERM its worker once the tool has written its row
    (the worker must exit 0 within `within` s), then let a second worker end it."""
    first = turns.worker("worker1", TURNSTILE_SHUTDOWN_GRACE_SECONDS=grace)
    try:
        handle = await turns.start(wf_id, "go")
        await wait_until(lambda: bool(side_effects(turns.db, wf_id)), timeout=30,
                         what="the tool never ran")
        assert sigterm(first, within=within) == 0
    finally:
        first.kill()
    second = turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        second.stop()
    return handle, result


async def test_sigterm_lets_a_running_tool_finish(turns: ProcessTurns,
                                                  fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("call-t", "slowWrite", {"note": "once", "seconds": 3})),
                    text_reply("done"))
    wf_id = f"term-tool-{turns.task_queue}"
    # slowWrite is NOT safe to run twice: the worker must let it finish.
    handle, result = await sigterm_during_tool(turns, wf_id, grace="30", within=40)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
    assert len(side_effects(turns.db, wf_id)) == 1
    [(_, started)] = await activity_runs(handle, EXECUTE_TOOL)
    assert started.activity_task_started_event_attributes.attempt == 1
    assert '"written": "once"' in fake_llm.requests[-1]["messages"][-1]["content"]


async def test_sigterm_settles_a_cut_off_tool_as_interrupted(turns: ProcessTurns,
                                                            fake_llm: FakeOpenAIServer) -> None:
    """slowWrite outlasts the grace period and is NOT safe to run twice: the
    stopping worker settles it as interrupted; it is never run again."""
    fake_llm.script(tool_reply(("call-t", "slowWrite", {"note": "once", "seconds": 60})),
                    text_reply("done"))
    wf_id = f"term-cut-{turns.task_queue}"
    handle, result = await sigterm_during_tool(turns, wf_id, grace="1", within=30)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.INTERRUPTED]
    assert len(side_effects(turns.db, wf_id)) == 1
    [(_, started)] = await activity_runs(handle, EXECUTE_TOOL)
    assert started.activity_task_started_event_attributes.attempt == 1  # not re-run
    assert "may or may not have taken effect" in fake_llm.requests[-1]["messages"][-1]["content"]
    assert [r.status for r in AuditLog(turns.db).rows(wf_id)] == ["FAILED"]
    assert truth.disagreements(turns.db, f"c-{wf_id}") == []


async def test_sigterm_hands_back_a_journaled_tool(turns: ProcessTurns, fake_llm: FakeOpenAIServer,
                                                   tmp_path: Path) -> None:
    """journaledWrite outlasts the grace period: its row rolls back with the
    attempt, which is handed back and run again by the next worker."""
    wrote = tmp_path / "wrote"
    fake_llm.script(tool_reply(("call-h", "journaledWrite",
                                {"note": "once", "marker": str(wrote), "seconds": 4})),
                    text_reply("done"))
    wf_id = f"term-journal-{turns.task_queue}"
    side_effects(turns.db)
    first = turns.worker("worker1", TURNSTILE_SHUTDOWN_GRACE_SECONDS="1")
    try:
        handle = await turns.start(wf_id, "go")
        await wait_until(wrote.exists, timeout=30, what="the tool never wrote")
        assert sigterm(first, within=30) == 0
    finally:
        first.kill()
    assert notes(turns.db, wf_id) == []
    second = turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        second.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
    assert notes(turns.db, wf_id) == ["once"]
    [(_, started)] = await activity_runs(handle, EXECUTE_TOOL)
    run = started.activity_task_started_event_attributes
    assert run.attempt == 2
    assert run.last_failure.application_failure_info.type == WORKER_SHUTDOWN, run.last_failure
    assert truth.disagreements(turns.db, f"c-{wf_id}") == []
