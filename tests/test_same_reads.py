"""Reads that tell the model nothing new (revision 10;
turnstile.engine.repeats.same_read). Qwen2.5-Coder-1.5B on llama-server,
constrained, called querySalesData with the same arguments eight times in a
turn and ended at the round-trip cap (measured, docs/local-models.md). A
repeatable call does run again; when the same call has come back the same
`ANSWER_AFTER` times its tool is withheld for the rest of the turn: no
longer offered, a call of it not run and a dead end. The model goes on with
the tools that are left, or answers. A read whose answer changes is polled
on; with the repeat breaker off the rule is off. A worker SIGKILLed after
the withholding, a reset after the third read and a cancel keep it as the
history says (and a next turn offers the read again). Pure rules, then
real turns on the scripted model server over HTTP, a Temporal dev server,
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError

from tests.support.resets import reset_to, task_after
from tests.support.services import make_service
from tests.support.turns import running_worker
from tests.support.waiting import wait_until
from tests.support.worker_loss import HangingReply, ProcessTurns, activity_runs
from tests.test_exit_paths import stored_pairing
from turnstile.engine.activity_io import EXECUTE_TOOL
from turnstile.engine.breakers import BreakerPolicy, Breakers
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.dead_ends import DEAD_END_AFTER
from turnstile.engine.repeats import ANSWER_AFTER, same_read, withheld_text
from turnstile.engine.specs import ToolSpec
from turnstile.runtime.tools import ToolRegistry, tool
from turnstile.stores.db import Database
from turnstile.stores.truth import disagreements
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

READ = ToolSpec(name="lookup", description="a read", parameters={"type": "object"},
                repeatable=True)
WRITE = ToolSpec(name="send", description="an effect", parameters={"type": "object"})


def test_only_the_same_read_with_the_same_result_counts() -> None:
    b = Breakers(BreakerPolicy())
    same_read(b, READ, "lookup", '{"q": 1}', "ten")
    same_read(b, READ, "lookup", '{"q": 2}', "ten")  # other arguments
    same_read(b, READ, "lookup", '{"q": 1}', "eleven")  # its answer changed
    assert b.same_reads == {} and not b.is_withheld("lookup")
    same_read(b, READ, "lookup", '{ "q" : 1 }', "eleven")  # the same, spelled otherwise
    same_read(b, WRITE, "send", "{}", "ok")
    same_read(b, WRITE, "send", "{}", "ok")  # the repeat breaker's, not this rule's
    assert list(b.same_reads.values()) == [1] and not b.is_withheld("lookup")
    same_read(b, READ, "lookup", '{"q": 1}', "eleven")
    assert b.is_withheld("lookup") and not b.is_withheld("send")
    for policy in (BreakerPolicy(enabled=False), BreakerPolicy(repeat_identical=False)):
        off = Breakers(policy)
        for _ in range(ANSWER_AFTER + 2):
            same_read(off, READ, "lookup", "{}", "ten")
        assert off.same_reads == {} and not off.is_withheld("lookup")


def offered(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools", [])]


def same_sum(request: dict[str, Any]) -> dict[str, Any]:
    """add(2, 3) while it is offered; then an answer."""
    if "add" not in offered(request):
        return text_reply("The sum is 5.")
    return tool_reply((f"s{len(request['messages'])}", "add", {"a": 2, "b": 3}))


async def test_the_same_read_again_and_again_is_withheld_and_the_turn_goes_on(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = same_sum
    async with running_worker(client, task_queue, db.url, [make_service(max_round_trips=8)],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add 2 and 3")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "The sum is 5."
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * (ANSWER_AFTER + 1)
    *reading, after = fake_llm.requests
    assert all("add" in offered(r) for r in reading) and len(reading) == ANSWER_AFTER + 1
    # The other tools are still offered; only the read that kept answering the same is not.
    assert "add" not in offered(after) and "echo" in offered(after)
    assert not fake_llm.refusals


async def test_a_model_that_calls_the_withheld_read_anyway_ends_in_the_dead_end_ask(
        client: Client, task_queue: str, tmp_path: Any, fake_llm: FakeOpenAIServer) -> None:
    """Written from memory, the call is not run (the model reads why); two
    such responses are dead ends, and the answer is asked for without tools."""
    fake_llm.default = lambda r: (text_reply("The sum is 5.") if "tools" not in r else
                                  tool_reply((f"s{len(r['messages'])}", "add", {"a": 2, "b": 3})))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service(max_round_trips=8)], llm_url=fake_llm.url) as turns:
        result = await turns.run("add 2 and 3")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "The sum is 5."
    assert [c.status for c in result.tool_calls] == (
        [CallStatus.COMPLETED] * (ANSWER_AFTER + 1) + [CallStatus.FAILED] * DEAD_END_AFTER)
    told = [m for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"][-1]
    assert told["content"] == withheld_text("add")
    assert "tools" not in fake_llm.requests[-1]


async def test_when_every_tool_is_withheld_the_request_offers_none(
        client: Client, task_queue: str, tmp_path: Any, fake_llm: FakeOpenAIServer) -> None:
    service = make_service(max_round_trips=8)
    service.tools = ToolRegistry([service.tool("add")])  # type: ignore[list-item]
    fake_llm.default = same_sum
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add 2 and 3")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "The sum is 5."
    assert "tools" not in fake_llm.requests[-1] and len(fake_llm.requests) == ANSWER_AFTER + 2
    assert not fake_llm.refusals


async def test_a_read_whose_answer_changes_is_not_cut_short(
        client: Client, task_queue: str, tmp_path: Any, fake_llm: FakeOpenAIServer) -> None:
    ticks = itertools.count(1)

    @tool(idempotent=True, repeatable=True)
    def jobStatus(job: str) -> dict[str, Any]:  # noqa: N802
        """A job's progress (a status check: asked again, it may answer otherwise)."""
        done = next(ticks)
        return {"job": job, "percent": min(100, 20 * done)}

    def poller(request: dict[str, Any]) -> dict[str, Any]:
        polled = sum(m["role"] == "tool" for m in request["messages"])
        if polled == 5:
            return text_reply("The job is done.")
        return tool_reply((f"p{polled}", "jobStatus", {"job": "j-1"}))

    service = make_service()
    service.tools = ToolRegistry([jobStatus])
    fake_llm.default = poller
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("wait for job j-1")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "The job is done."
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 5
    assert all("tools" in r for r in fake_llm.requests)
    assert "no longer offered" not in str(fake_llm.requests)


async def test_with_the_repeat_breaker_off_the_same_reads_run_to_the_cap(
        client: Client, task_queue: str, tmp_path: Any, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = same_sum
    service = make_service(max_round_trips=4, breakers={"repeat_identical": False})
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add 2 and 3")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "RoundTripCapExceeded"
    assert all("tools" in r for r in fake_llm.requests)


async def test_the_withheld_read_written_as_text_is_a_dead_end_then_dead_end_calls(
        client: Client, task_queue: str, tmp_path: Any, fake_llm: FakeOpenAIServer) -> None:
    """Measured on Qwen2.5-Coder-0.5B: once the query was withheld the model
    wrote its call as text; that is a dead end (not `ToolCallAsText`, whose
    message blames the server's parser), and after the ask without tools the
    turn ends naming what the model kept doing."""
    written = '{"name": "add", "arguments": {"a": 2, "b": 3}}'
    fake_llm.default = lambda r: (same_sum(r) if "add" in offered(r) else text_reply(written))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service(max_round_trips=8)], llm_url=fake_llm.url) as turns:
        result = await turns.run("add 2 and 3")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "DeadEndCalls", result.error
    assert "calling add again, which kept returning the same result" in result.error.message
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * (ANSWER_AFTER + 1)
    assert "tools" not in fake_llm.requests[-1]
    assert len(fake_llm.requests) == ANSWER_AFTER + 1 + DEAD_END_AFTER + 1


# --- ends of a turn with a withheld read ----------------------------------------------------

def held_after_withholding(hang: HangingReply) -> Any:
    """same_sum, but the first request without `add` is held open (by `hang`)."""
    held = []

    def model(request: dict[str, Any]) -> dict[str, Any]:
        if "add" not in offered(request) and not held:
            held.append(request)
            return hang(request)
        return same_sum(request)
    return model



async def test_a_worker_killed_after_the_read_was_withheld_still_withholds_it(
        db_process_turns: ProcessTurns, fake_llm: FakeOpenAIServer) -> None:
    """`python worker.py` SIGKILLed while the first request without `add` is
    open: the next worker rebuilds the turn from history, asks the same
    request again (still without `add`), and the read ran three times only."""
    hang = HangingReply()
    fake_llm.default = held_after_withholding(hang)
    wf_id = f"same-reads-kill-{db_process_turns.task_queue}"
    first = db_process_turns.worker("worker1")
    try:
        handle = await db_process_turns.start(wf_id, "add 2 and 3")
        await wait_until(hang.entered.is_set, timeout=30, what="the request without add")
    finally:
        first.kill()
    second = db_process_turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        hang.released.set()
        second.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "The sum is 5."
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * (ANSWER_AFTER + 1)
    *_, held, retried = fake_llm.requests
    assert retried["messages"] == held["messages"] and offered(retried) == offered(held)
    assert "add" not in offered(retried) and "echo" in offered(retried)
    runs = await activity_runs(handle, EXECUTE_TOOL)
    assert len(runs) == ANSWER_AFTER + 1


async def test_a_cancelled_turn_s_withheld_read_is_offered_again_in_the_next_turn(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    hang = HangingReply()
    fake_llm.default = held_after_withholding(hang)
    conv = f"c-withheld-{uuid.uuid4().hex[:6]}"
    try:
        async with running_worker(client, task_queue, db.url, [make_service(max_round_trips=8)],
                                  llm_url=fake_llm.url) as turns:
            handle = await turns.start("add 2 and 3", conversation=conv)
            await wait_until(hang.entered.is_set, timeout=30, what="the request without add")
            await handle.cancel()
            with pytest.raises(WorkflowFailureError) as err:
                await handle.result()
            assert isinstance(err.value.cause, CancelledError)
            before = len(fake_llm.requests)
            nxt = await turns.run("add 2 and 3 again", conversation=conv)
            violations = stored_pairing(db, conv)
            truth = disagreements(db, conv)
    finally:
        hang.released.set()
    assert nxt.status == TurnStatus.COMPLETED, nxt.error
    assert "add" in offered(fake_llm.requests[before])  # withholding lasts one turn
    assert violations == [] and truth == []


async def test_a_turn_reset_after_its_third_read_still_withholds_it(
        client: Client, task_queue: str, tmp_path: Any, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = same_sum
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service(max_round_trips=8)], llm_url=fake_llm.url) as turns:
        handle = await turns.start("add 2 and 3")
        first = await handle.result()
        run = handle.result_run_id
        assert run is not None
        point = await task_after(client, handle.id, run, EXECUTE_TOOL, nth=ANSWER_AFTER + 1)
        before = len(fake_llm.requests)
        again = await (await reset_to(client, handle.id, run, point)).result()
    assert first.status == again.status == TurnStatus.COMPLETED, (first.error, again.error)
    assert again.answer == "The sum is 5."
    [asked] = fake_llm.requests[before:]  # the reset run asks once, without `add`
    assert "add" not in offered(asked) and "echo" in offered(asked)
