"""`turnstile.client` typed to the end, through a real dev server, worker and
the strict fake model: a cancelled, a terminated and a reset turn each give
their typed ending (the reset one: the reset run's result, from the handle
of the first run); `events()` of a turn with more than 200 events delivers
every one by absolute offset, and the end, also when resumed late."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from tests.support.resets import reset_to, task_after
from tests.support.services import add, sendMoneySlowly
from tests.support.turns import running_worker, wait_pending
from tests.test_client import _client, plain_service
from turnstile.client import (
    TurnCancelledError,
    TurnEndedError,
    TurnTerminatedError,
)
from turnstile.engine.activity_io import EXECUTE_TOOL
from turnstile.engine.breakers import BreakerPolicy
from turnstile.engine.contract import CallStatus, TurnInput, TurnStatus
from turnstile.engine.specs import LoopPolicy
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

PAY = ("p1", "sendMoneySlowly", {"to": "bob@example.com", "amount": 5})


def _turn(user: str = "alice") -> TurnInput:
    return TurnInput(conversation_id=f"c-{uuid.uuid4().hex[:6]}", user_id=user,
                     message="pay bob", service="test")


async def test_cancelled_and_terminated_turns_end_typed(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = lambda req: tool_reply(PAY)
    tc = _client(client, task_queue)
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [plain_service()], llm_url=fake_llm.url):
        cancelled = await tc.start_turn(_turn())
        terminated = await tc.start_turn(_turn("bob"))
        for turn in (cancelled, terminated):
            await wait_pending(tc.temporal.get_workflow_handle(turn.id))
        await cancelled.cancel()
        await tc.temporal.get_workflow_handle(terminated.id).terminate(reason="operator: stop")
        with pytest.raises(TurnCancelledError) as was_cancelled:
            await cancelled.result()
        with pytest.raises(TurnTerminatedError) as was_terminated:
            await terminated.result()
        cancel_events = [e async for e in cancelled.events()]
        term_events = [e async for e in terminated.events()]
        outcome = await cancelled.outcome()
    ended = was_cancelled.value
    assert isinstance(ended, TurnEndedError) and ended.status == "cancelled"
    assert ended.progress is not None  # what the turn had done, with its call settled
    [call] = ended.progress.tool_calls
    assert call.id == "p1" and call.status != CallStatus.PENDING
    assert was_terminated.value.status == "terminated"
    assert "operator: stop" in was_terminated.value.reason
    assert outcome.status == "cancelled" and outcome.result is None
    # The end is always delivered: the workflow's own (cancelled) or the
    # client's (terminated: the workflow could not record it).
    assert cancel_events[-1].step == "turn_completed"
    assert cancel_events[-1].detail.startswith("cancelled")
    assert "awaiting_approval" in [e.step for e in cancel_events]
    assert (term_events[-1].step, term_events[-1].detail) == ("turn_completed", "terminated")


async def test_the_handle_follows_a_reset_run(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("a1", "add", {"a": 1, "b": 2})), tool_reply(PAY),
                    # the reset run, from just after the add: asks again, pays, answers
                    tool_reply(PAY), text_reply("paid after the reset"))
    tc = _client(client, task_queue)
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [plain_service()], llm_url=fake_llm.url):
        turn = await tc.start_turn(_turn())
        first_run = turn.run_id or ""
        waiting = asyncio.ensure_future(turn.result())  # bound to the first run, waiting
        await wait_pending(tc.temporal.get_workflow_handle(turn.id, run_id=first_run))
        point = await task_after(client, turn.id, first_run, EXECUTE_TOOL)
        after = await reset_to(client, turn.id, first_run, point)
        await wait_pending(after)
        await tc.review(turn.id, "p1", True, "carol", "ok after the reset")
        result = await asyncio.wait_for(waiting, 60)
        steps = [e.step async for e in turn.events()]
    assert result.status == TurnStatus.COMPLETED and result.answer == "paid after the reset"
    assert turn.run_id == after.run_id != first_run
    assert steps[-1] == "turn_completed"


async def test_events_beyond_200_by_absolute_offset(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """A turn of 30 rounds of 3 calls each (~250 events): a follower reads all,
    in order, ending with the end; one resuming at 240 gets the rest; one
    starting at 0 after the end is told what it missed, then gets the end."""
    rounds = 30
    replies = [tool_reply(*((f"r{r}c{i}", "add", {"a": r, "b": i}) for i in range(3)))
               for r in range(rounds)]
    fake_llm.script(*replies, text_reply("summed"))
    many = Service(name="test", system_prompt="You add.", tools=ToolRegistry([add]),
                   loop=LoopPolicy(breakers=BreakerPolicy(max_tool_executions=1000,
                                                          max_alternations=1000)))
    tc = _client(client, task_queue)
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [many],
                              llm_url=fake_llm.url):
        turn = await tc.start_turn(_turn())
        live = [e async for e in turn.events(poll=0.05)]
        result = await turn.result()
        final = await turn.status()
        total = final.events_offset + len(final.events)
        resumed = [e async for e in turn.events(offset=total - 5)]
        late = [e async for e in turn.events(offset=0)]
    assert result.status == TurnStatus.COMPLETED and total > 200
    assert final.events_offset == total - 200  # the workflow keeps its latest 200
    assert len(live) == total and live[-1].step == "turn_completed"
    assert sum(e.step == "tool_result" for e in live) == 3 * rounds
    assert resumed == live[-5:]
    assert late[0].step == "events_missed" and late[0].detail.startswith(f"{total - 200} ")
    assert late[1:] == live[-200:]
    _ = sendMoneySlowly  # (the approval tool of plain_service, used above)
