"""A lost worker costs seconds: a worker SIGKILLed during a model call is
noticed by the model activity's heartbeat timeout (not its 180 s
start-to-close timeout), and a worker that gets SIGTERM finishes what it
holds, or hands it back, before it exits.

Every assertion is on the turn's history (which attempt ran, why the one
before it ended), never on wall time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle

from activities.runtime import WORKER_SHUTDOWN
from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
from tests.support.services import side_effects
from tests.support.temporal_server import DevServer
from tests.support.worker_process import WorkerProcess
from turnstile.engine.activity_io import CALL_MODEL, EXECUTE_TOOL
from turnstile.engine.contract import WORKFLOW_TYPE, CallStatus, TurnInput, TurnResult, TurnStatus
from turnstile.engine.specs import DEFAULT_HEARTBEAT_SECONDS
from turnstile.stores.db import Database


class HangingReply:
    """A model reply that holds its HTTP request open until released, as a
    model that is still thinking when the worker dies."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.entered.set()
        self.released.wait(120)
        return text_reply("too late: this worker is gone")


class Turns:
    def __init__(self, client: Client, server: DevServer, task_queue: str, tmp: Path,
                 llm_url: str) -> None:
        self.client, self.task_queue, self.tmp = client, task_queue, tmp
        db_url = f"sqlite:///{tmp}/t.db"
        self.db = Database(db_url)
        self.env = {"TEMPORAL_ADDRESS": server.address, "TURNSTILE_TASK_QUEUE": task_queue,
                    "DATABASE_URL": db_url, "LLM_BASE_URL": llm_url}

    def worker(self, name: str, **env: str) -> WorkerProcess:
        return WorkerProcess(self.tmp / f"{name}.log", {**self.env, **env}).start()

    async def start(self, wf_id: str, message: str) -> WorkflowHandle[Any, TurnResult]:
        return await self.client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id=f"c-{wf_id}", user_id="alice",
                                     message=message, service="test",
                                     variables={"team": "ops"}),
            id=wf_id, task_queue=self.task_queue, result_type=TurnResult)


@pytest.fixture
def turns(client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
          fake_llm: FakeLLM) -> Turns:
    return Turns(client, temporal_server, task_queue, tmp_path, fake_llm.url)


async def wait_until(check: Any, what: str, timeout: float = 30) -> None:
    for _ in range(int(timeout / 0.1)):
        if check():
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(what)


async def activity_runs(handle: WorkflowHandle[Any, TurnResult],
                        name: str) -> list[tuple[HistoryEvent, HistoryEvent]]:
    """(scheduled, started) event pairs of one activity type. The started event
    of a retried activity carries the final attempt and the previous attempt's
    failure (the server records only the last attempt)."""
    history = await handle.fetch_history()
    scheduled = {e.event_id: e for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name == name}
    return [(scheduled[e.activity_task_started_event_attributes.scheduled_event_id], e)
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            and e.activity_task_started_event_attributes.scheduled_event_id in scheduled]


def sigterm(worker: WorkerProcess, within: float) -> int:
    """SIGTERM the worker and return its exit code (it must exit by itself)."""
    assert worker.proc is not None
    os.killpg(worker.proc.pid, signal.SIGTERM)
    try:
        return worker.proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise


async def test_worker_killed_during_model_call(turns: Turns, fake_llm: FakeLLM) -> None:
    hang = HangingReply()
    fake_llm.script(hang, text_reply("answered by the second worker"))
    wf_id = f"kill-model-{turns.task_queue}"
    first = turns.worker("worker1")
    try:
        handle = await turns.start(wf_id, "hello")
        await wait_until(hang.entered.is_set, "the model request never arrived")
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


async def test_sigterm_hands_back_a_model_call(turns: Turns, fake_llm: FakeLLM) -> None:
    hang = HangingReply()
    fake_llm.script(hang, text_reply("answered after the handover"))
    wf_id = f"term-model-{turns.task_queue}"
    first = turns.worker("worker1", TURNSTILE_SHUTDOWN_GRACE_SECONDS="1")
    try:
        handle = await turns.start(wf_id, "hello")
        await wait_until(hang.entered.is_set, "the model request never arrived")
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


async def test_sigterm_lets_a_running_tool_finish(turns: Turns, fake_llm: FakeLLM) -> None:
    fake_llm.script(tool_reply(("call-t", "slowWrite", {"note": "once", "seconds": 3})),
                    text_reply("done"))
    wf_id = f"term-tool-{turns.task_queue}"
    first = turns.worker("worker1", TURNSTILE_SHUTDOWN_GRACE_SECONDS="30")
    try:
        handle = await turns.start(wf_id, "go")
        await wait_until(lambda: bool(side_effects(turns.db, wf_id)), "the tool never ran")
        # slowWrite is NOT safe to run twice: the worker must let it finish.
        assert sigterm(first, within=40) == 0
    finally:
        first.kill()
    second = turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        second.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
    assert len(side_effects(turns.db, wf_id)) == 1
    [(_, started)] = await activity_runs(handle, EXECUTE_TOOL)
    assert started.activity_task_started_event_attributes.attempt == 1
    assert '"written": "once"' in fake_llm.requests[-1]["messages"][-1]["content"]
