"""SIGKILL the worker at the worst moments — mid-tool, while a turn waits for
approval, mid-compensation — and let a new worker finish: every effect is
applied or undone exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle

from tests.support.services import side_effects
from tests.support.temporal_server import DevServer
from tests.support.worker_env import STICKY_QUEUE_TIMEOUT_SECONDS
from tests.support.worker_loss import sticky_timeouts
from tests.support.worker_process import WorkerProcess
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    CallStatus,
    PendingApproval,
    TurnInput,
    TurnResult,
    TurnStatus,
)
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


class Crash:
    """A turn on a subprocess worker that is SIGKILLed once `moment` holds,
    then finished by a second worker process."""

    def __init__(self, client: Client, server: DevServer, task_queue: str, tmp_path: Path,
                 llm_url: str) -> None:
        self.client, self.task_queue, self.tmp = client, task_queue, tmp_path
        db_url = f"sqlite:///{tmp_path}/t.db"
        self.db = Database(db_url)
        self.env = {"TEMPORAL_ADDRESS": server.address, "TURNSTILE_TASK_QUEUE": task_queue,
                    "DATABASE_URL": db_url, "LLM_BASE_URL": llm_url}

    def use(self, db_url: str) -> None:
        """Run the turn's workers on this database instead (e.g. PostgreSQL)."""
        self.db = Database(db_url)
        self.env = {**self.env, "DATABASE_URL": db_url}

    async def kill_when(self, wf_id: str, message: str,
                        moment: Callable[[WorkflowHandle], Awaitable[bool]]) -> WorkflowHandle:
        first = WorkerProcess(self.tmp / "worker1.log", self.env).start()
        try:
            handle = await self.client.start_workflow(
                WORKFLOW_TYPE, TurnInput(conversation_id=f"c-{wf_id}", user_id="alice",
                                         message=message, service="test",
                                         variables={"team": "ops"}),
                id=wf_id, task_queue=self.task_queue, result_type=TurnResult)
            for _ in range(300):
                if await moment(handle):
                    break
                await asyncio.sleep(0.1)
            else:
                raise TimeoutError(f"{wf_id}: the moment to kill never came")
        finally:
            first.kill()
        return handle

    async def resume(self, handle: WorkflowHandle) -> TurnResult:
        second = WorkerProcess(self.tmp / "worker2.log", self.env).start()
        try:
            return await asyncio.wait_for(handle.result(), timeout=60)
        finally:
            second.stop()


@pytest.fixture
def crash(client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
          fake_llm: FakeOpenAIServer) -> Crash:
    return Crash(client, temporal_server, task_queue, tmp_path, fake_llm.url)


@pytest.mark.parametrize(("tool", "expected"), [
    # idempotent: re-run on the new worker, its own key makes the write happen once
    ("slowUpsert", CallStatus.COMPLETED),
    # not safe to run twice: never re-run blindly; the model is told it was interrupted
    ("slowWrite", CallStatus.INTERRUPTED),
])
async def test_worker_killed_mid_tool(crash: Crash, fake_llm: FakeOpenAIServer, tool: str,
                                      expected: CallStatus) -> None:
    fake_llm.script(tool_reply(("call-k", tool, {"note": "once", "seconds": 4})),
                    text_reply("done"))
    wf_id = f"kill-{tool}-{crash.task_queue}"

    async def tool_running(_: WorkflowHandle) -> bool:
        return bool(side_effects(crash.db, wf_id))

    handle = await crash.kill_when(wf_id, "go", tool_running)
    result = await crash.resume(handle)
    db = crash.db
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [expected]
    assert len(side_effects(db, wf_id)) == 1
    # What the model was told about the call in its next request:
    tool_msg = fake_llm.requests[-1]["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "call-k"
    if expected == CallStatus.INTERRUPTED:
        assert "may or may not have taken effect" in tool_msg["content"]
    else:
        assert '"written": "once"' in tool_msg["content"]



async def test_worker_killed_while_waiting_for_approval(crash: Crash,
                                                        fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob", "amount": 3})),
                    text_reply("paid"))
    wf_id = f"kill-approval-{crash.task_queue}"

    async def waiting(handle: WorkflowHandle) -> bool:
        return bool(await handle.query("pending_approvals", result_type=list[PendingApproval]))

    handle = await crash.kill_when(wf_id, "pay", waiting)
    # No worker: the approval is still recorded by the server.
    await handle.signal("approve", ApproveSignal(tool_call_id="p1", reviewer="carol"))
    result = await crash.resume(handle)
    assert result.status == TurnStatus.COMPLETED
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
    assert len(side_effects(crash.db, wf_id)) == 1
    # The signal's workflow task went to the dead worker's sticky queue (the
    # server sends it there while that worker polled in the last 10 s) and
    # moved to the task queue after TURNSTILE_STICKY_QUEUE_TIMEOUT_SECONDS,
    # the tests' 3 s, not the SDK's 10 s.
    [(on_sticky, timed_out)] = await sticky_timeouts(handle)
    waited = timed_out.event_time.ToDatetime() - on_sticky.event_time.ToDatetime()
    assert STICKY_QUEUE_TIMEOUT_SECONDS - 0.1 <= waited.total_seconds() < 7, waited


async def test_worker_killed_during_compensation(crash: Crash, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("r1", "slowUndoReserve", {"item": "hall"})),
                    tool_reply(("m1", "mustSucceed", {})))
    wf_id = f"kill-undo-{crash.task_queue}"
    db = crash.db

    async def undoing(_: WorkflowHandle) -> bool:
        return any(e["note"] == "CANCELLING" for e in side_effects(db, wf_id))

    handle = await crash.kill_when(wf_id, "book", undoing)
    result = await crash.resume(handle)
    assert result.status == TurnStatus.ROLLED_BACK
    assert result.tool_calls[0].status == CallStatus.ROLLED_BACK
    assert [e["note"] for e in side_effects(db, wf_id)] == ["CANCELLED"]
    assert [r.status for r in AuditLog(db).rows(wf_id) if r.tool_name == "slowUndoReserve"] \
        == ["ROLLED_BACK"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_worker_killed_while_a_cancelled_thread_tool_is_waited_out(
        crash: Crash, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    """A plain-function tool's thread runs on after its turn was cancelled;
    the worker waits it out, and the undo waits for it. The worker is SIGKILLed
    in that wait, before the effect lands. A new worker ends the turn
    cancelled: the undo gives up waiting on the lost claim and undoes without
    its result, nothing was booked, memory and the journal agree."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import CancelledError

    from turnstile.engine.activity_io import COMPENSATE_TOOL, EXECUTE_TOOL
    from turnstile.stores.memory import MemoryStore
    from turnstile.stores.truth import disagreements

    if backend == "postgresql":
        crash.use(request.getfixturevalue("postgres_url"))
    fake_llm.script(tool_reply(("b1", "slowBook", {"item": "room 9", "seconds": 8})),
                    text_reply("nothing is booked"))
    wf_id = f"kill-waitout-{crash.task_queue}"
    cancelled = False

    async def scheduled(handle: WorkflowHandle) -> set[str]:
        names: set[str] = set()
        async for e in handle.fetch_history_events():
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                names.add(e.activity_task_scheduled_event_attributes.activity_type.name)
        return names

    async def undo_waits(handle: WorkflowHandle) -> bool:
        nonlocal cancelled
        names = await scheduled(handle)
        if EXECUTE_TOOL in names and not cancelled:  # the booking's thread runs
            await handle.cancel()
            cancelled = True
        return COMPENSATE_TOOL in names  # the undo waits for the booking's attempt

    handle = await crash.kill_when(wf_id, "book room 9", undo_waits)
    with pytest.raises(WorkflowFailureError) as err:
        await crash.resume(handle)
    assert isinstance(err.value.cause, CancelledError)
    conv = f"c-{wf_id}"
    assert side_effects(crash.db, wf_id) == []  # killed before the booking landed
    [told] = [m for m in MemoryStore(crash.db).messages(conv)
              if m.role == "tool" and m.tool_call_id == "b1"]
    assert told.is_error
    assert disagreements(crash.db, conv) == []
