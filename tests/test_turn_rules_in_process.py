"""The approval, deadline, breaker and cancel rules of a turn, fast: the real
`AgentTurn` on an in-process worker with stand-in activities registered
under the real names (tests/support/stand_ins.py), so no database, no model
server and no worker subprocess. The same rules end to end, with the real
activities: tests/test_approvals.py, tests/test_tool_semantics.py,
tests/test_saga.py and tests/test_exit_paths.py."""

from __future__ import annotations

import json
import time
import typing
import uuid
from datetime import datetime
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError

from tests.support.stand_ins import StandIns, stand_in_worker, text_reply, tool_reply
from tests.support.turns import wait_pending
from tests.support.waiting import wait_until
from turnstile.engine import activity_io as io
from turnstile.engine.breakers import BreakerPolicy
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    CallStatus,
    Handlers,
    RejectSignal,
    TurnInput,
    TurnProgress,
    TurnResult,
    TurnStatus,
)
from turnstile.engine.errors import TurnCancelled
from turnstile.engine.events import TurnCompleted
from turnstile.engine.messages import ToolCall
from turnstile.engine.specs import LoopPolicy, RetrySpec, ServiceSpec, ToolSpec

REQUESTER = "alice"
PAY = tool_reply(("p1", "pay", {"to": "bob@example.com", "amount": 10}))


def tool(name: str, **policy: Any) -> ToolSpec:
    return ToolSpec(name=name, description=f"{name} (stand-in)",
                    parameters={"type": "object"}, **policy)


def service(*tools: ToolSpec, loop: LoopPolicy | None = None) -> ServiceSpec:
    return ServiceSpec(name="rules", tools=list(tools), loop=loop or LoopPolicy())


async def start(client: Client, task_queue: str) -> WorkflowHandle[Any, TurnResult]:
    turn = TurnInput(conversation_id=f"c-{uuid.uuid4().hex[:8]}", user_id=REQUESTER,
                     message="go", service="rules")
    return await client.start_workflow(WORKFLOW_TYPE, turn, id=f"rules-{uuid.uuid4().hex[:12]}",
                                       task_queue=task_queue, result_type=TurnResult)


async def status(handle: WorkflowHandle[Any, Any]) -> TurnProgress:
    progress: TurnProgress = await handle.query(Handlers.STATUS, result_type=TurnProgress)
    return progress


def only_text(stand_ins: StandIns, call_id: str) -> str:
    """The one result memory holds for `call_id`, which must be an error."""
    [result] = stand_ins.result_of(call_id)
    assert result.is_error, result
    return result.content or ""


def test_stand_ins_take_and_return_what_the_real_activities_do() -> None:
    """Each stand-in is registered under a real name with that activity's
    input and result types (tests/test_activity_refs.py checks the real ones)."""
    refs = {r.name: r for r in vars(io).values() if isinstance(r, io.ActivityRef)}
    stand_ins = StandIns(service(), [])
    names = set()
    for fn in stand_ins.activities():
        defn = activity._Definition.from_callable(fn)
        assert defn is not None and defn.name is not None
        names.add(defn.name)
        if defn.name == io.PUBLISH_EVENT:  # scheduled without a reference
            continue
        hints = typing.get_type_hints(fn)
        (param,) = [v for k, v in hints.items() if k != "return"]
        assert (param, hints["return"]) == (refs[defn.name].input_type,
                                            refs[defn.name].result_type), defn.name
    # Every activity a turn without pipeline components may schedule.
    assert names == {io.BEGIN_TURN, io.LOAD_MEMORY, io.APPEND_MESSAGES,
                     io.RELEASE_CONVERSATION, io.PUBLISH_EVENT, io.CALL_MODEL,
                     io.RESOLVE_TOOLS, io.REVIEW_CALL, io.CLAIM_GRANT, io.EXECUTE_TOOL,
                     io.COMPENSATE_TOOL,
                     io.RECORD_COMPENSATION_FAILURE}


# -- approvals ---------------------------------------------------------------------
async def test_a_call_waits_for_approval_and_runs_once_approved(
        client: Client, task_queue: str) -> None:
    stand_ins = StandIns(service(tool("pay", requires_approval=True)), [PAY, text_reply("paid")])
    async with stand_in_worker(client, task_queue, stand_ins):
        handle = await start(client, task_queue)
        [pending] = await wait_pending(handle)
        assert (pending.tool_call_id, pending.tool_name) == ("p1", "pay")
        assert pending.arguments == {"to": "bob@example.com", "amount": 10}
        assert pending.validated and stand_ins.reviewed == ["p1"]  # checked before asking
        assert (await status(handle)).step == "awaiting_approval"
        # The requester may not approve her own call: refused, the call still waits.
        await handle.signal(Handlers.APPROVE, ApproveSignal(tool_call_id="p1",
                                                            reviewer=REQUESTER))

        async def refused() -> TurnProgress | None:
            progress = await status(handle)
            return progress if progress.refused_signals else None

        progress: TurnProgress = await wait_until(refused, what="the self-approval refused")
        assert "may not decide it" in progress.refused_signals[0]
        assert [p.tool_call_id for p in progress.pending_approvals] == ["p1"]
        assert stand_ins.attempts == []  # nothing ran while the call waited
        await handle.signal(Handlers.APPROVE, ApproveSignal(tool_call_id="p1", reviewer="carol",
                                                            comment="ok"))
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "paid"
    assert [(c.id, c.status) for c in result.tool_calls] == [("p1", CallStatus.COMPLETED)]
    assert stand_ins.executed == ["p1"]
    assert stand_ins.decisions() == [("p1", True, "carol")]
    assert [m.content for m in stand_ins.result_of("p1")] == ["pay done"]
    assert stand_ins.pairing_problems() == []


async def test_a_rejected_call_is_recorded_rejected_and_never_runs(
        client: Client, task_queue: str) -> None:
    stand_ins = StandIns(service(tool("pay", requires_approval=True)),
                         [PAY, text_reply("not paid")])
    async with stand_in_worker(client, task_queue, stand_ins):
        handle = await start(client, task_queue)
        await wait_pending(handle)
        await handle.signal(Handlers.REJECT, RejectSignal(tool_call_id="p1", reviewer="carol",
                                                          reason="amount looks wrong"))
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "not paid"
    [call] = result.tool_calls
    assert (call.status, call.is_error) == (CallStatus.REJECTED, True)
    assert stand_ins.attempts == []  # the tool never ran
    assert "rejected by carol: amount looks wrong. It did not run." in only_text(stand_ins, "p1")
    assert stand_ins.decisions() == [("p1", False, "carol")]
    assert len(stand_ins.model_calls) == 2  # the model was asked again, with the rejection
    assert stand_ins.pairing_problems() == []


# -- the approval deadline ------------------------------------------------------------
async def test_no_decision_by_the_deadline_rejects_the_call(
        client: Client, task_queue: str) -> None:
    stand_ins = StandIns(service(tool("pay", requires_approval=True,
                                      approval_timeout_seconds=2.0)),
                         [PAY, text_reply("nobody decided")])
    async with stand_in_worker(client, task_queue, stand_ins):
        began = time.monotonic()
        handle = await start(client, task_queue)
        [pending] = await wait_pending(handle)
        waited = (datetime.fromisoformat(pending.deadline)
                  - datetime.fromisoformat(pending.requested_at)).total_seconds()
        assert waited == 2.0
        result = await handle.result()  # nobody decides
        elapsed = time.monotonic() - began
    assert elapsed >= 2.0  # the deadline was waited for, not skipped
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.REJECTED]
    assert stand_ins.attempts == []
    assert "rejected by deadline: no decision within 2 s" in only_text(stand_ins, "p1")
    assert stand_ins.decisions() == [("p1", False, "deadline")]
    assert stand_ins.pairing_problems() == []


# -- circuit breakers -----------------------------------------------------------------
def flaky(call: ToolCall) -> str:
    """Works, or fails every attempt: retryably (Temporal retries the call by
    its RetrySpec), or for good (one attempt; the server's retry timer costs
    about a second, so most calls here fail this way)."""
    arguments = json.loads(call.arguments)
    if arguments["fail"] == "retryably":
        raise ApplicationError("backend down")
    if arguments["fail"] == "for good":
        raise ApplicationError("backend gone", non_retryable=True)
    return "flaky worked"


async def test_a_tool_failing_in_a_row_is_disabled_by_its_breaker(
        client: Client, task_queue: str) -> None:
    """Three failures in a row (after each call's retries) disable the tool for
    the rest of the turn; a success between failures starts the count again;
    other tools keep running."""
    retried, fails, works = {"fail": "retryably"}, {"fail": "for good"}, {"fail": ""}
    stand_ins = StandIns(
        service(tool("flaky", retry=RetrySpec(maximum_attempts=2, initial_interval_seconds=0.1)),
                tool("echo"),
                loop=LoopPolicy(breakers=BreakerPolicy(consecutive_failures=3))),
        [tool_reply(("f0", "flaky", retried)), tool_reply(("f1", "flaky", works)),
         tool_reply(("f2", "flaky", fails)), tool_reply(("f3", "flaky", fails)),
         tool_reply(("f4", "flaky", fails)),
         tool_reply(("f5", "flaky", works), ("e1", "echo", {})),
         text_reply("gave up on flaky")],
        tools={"flaky": flaky})
    async with stand_in_worker(client, task_queue, stand_ins):
        handle = await start(client, task_queue)
        result = await handle.result()
        progress = await status(handle)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [(c.id, c.status) for c in result.tool_calls] == [
        ("f0", CallStatus.FAILED), ("f1", CallStatus.COMPLETED), ("f2", CallStatus.FAILED),
        ("f3", CallStatus.FAILED), ("f4", CallStatus.FAILED), ("f5", CallStatus.FAILED),
        ("e1", CallStatus.COMPLETED)]
    # A call's failure counts once its retries are spent; f5 never ran
    # although it would have worked.
    assert stand_ins.attempts == [
        ("f0", 1), ("f0", 2), ("f1", 1), ("f2", 1), ("f3", 1), ("f4", 1), ("e1", 1)]
    assert stand_ins.executed == ["f1", "e1"]
    assert "flaky failed after its retries: backend down" in only_text(stand_ins, "f0")
    assert "flaky failed after its retries: backend gone" in only_text(stand_ins, "f4")
    assert ("Tool flaky is disabled for the rest of this turn after 3 consecutive failures"
            in only_text(stand_ins, "f5"))
    breaker_events = [e.detail for e in progress.events if e.step == "breaker"]
    assert breaker_events == ["flaky disabled after 3 consecutive failures"]
    assert stand_ins.pairing_problems() == []


# -- cancel ------------------------------------------------------------------------
async def test_cancel_while_a_call_awaits_approval_settles_it_and_undoes_what_ran(
        client: Client, task_queue: str) -> None:
    stand_ins = StandIns(
        service(tool("reserve", compensation="unreserve"), tool("pay", requires_approval=True)),
        [tool_reply(("r1", "reserve", {"item": "table"})), PAY])
    async with stand_in_worker(client, task_queue, stand_ins):
        handle = await start(client, task_queue)
        await wait_pending(handle)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as err:
            await handle.result()
        progress = await status(handle)  # the closed turn, replayed by the worker
    assert isinstance(err.value.cause, CancelledError)
    assert progress.step == TurnStatus.CANCELLED
    assert [(c.id, c.status) for c in progress.tool_calls] == [
        ("r1", CallStatus.ROLLED_BACK), ("p1", CallStatus.FAILED)]
    # The completed, compensable reservation was undone, because of the cancel.
    [undo] = stand_ins.compensated
    assert undo.call.id == "r1" and undo.cause.type == TurnCancelled.error_type
    assert stand_ins.compensation_failures == []
    # The payment never ran; memory says so, and every call has its result.
    assert stand_ins.executed == ["r1"]
    assert only_text(stand_ins, "p1") == (
        "Not run: the turn was cancelled before this call to pay ran.")
    assert stand_ins.pairing_problems() == []
    # The conversation was released once, carrying "turn completed" as cancelled.
    [release] = stand_ins.releases
    assert [(e.kind, e.status) for e in release.events if isinstance(e, TurnCompleted)] == [
        ("turn_completed", TurnStatus.CANCELLED)]
