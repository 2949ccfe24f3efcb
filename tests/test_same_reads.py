"""Reads that tell the model nothing new (revision 10;
turnstile.engine.repeats.same_read). Qwen2.5-Coder-1.5B on llama-server,
constrained, called querySalesData with the same arguments eight times in a
turn and ended at the round-trip cap (measured on this head,
docs/local-models.md). A repeatable call does run again; after
`ANSWER_AFTER` calls that return what the same call returned before, the
model is asked once for its answer without tools. A read whose answer
changes is not cut short; with the repeat breaker off the rule is off.
Pure rules, then real turns on the scripted model server over HTTP, a
Temporal dev server, SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.engine.breakers import BreakerPolicy, Breakers
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.repeats import ANSWER_AFTER, READ_AGAIN_NOW, same_read
from turnstile.engine.specs import ToolSpec
from turnstile.runtime.tools import ToolRegistry, tool
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

READ = ToolSpec(name="lookup", description="a read", parameters={"type": "object"},
                repeatable=True)
WRITE = ToolSpec(name="send", description="an effect", parameters={"type": "object"})


def test_only_the_same_read_with_the_same_result_counts() -> None:
    b = Breakers(BreakerPolicy())
    same_read(b, READ, "lookup", '{"q": 1}', "ten")
    same_read(b, READ, "lookup", '{"q": 2}', "ten")  # other arguments
    same_read(b, READ, "lookup", '{"q": 1}', "eleven")  # its answer changed
    assert b.same_reads == 0
    same_read(b, READ, "lookup", '{ "q" : 1 }', "eleven")  # the same, spelled otherwise
    same_read(b, WRITE, "send", "{}", "ok")
    same_read(b, WRITE, "send", "{}", "ok")  # the repeat breaker's, not this rule's
    assert b.same_reads == 1
    for policy in (BreakerPolicy(enabled=False), BreakerPolicy(repeat_identical=False)):
        off = Breakers(policy)
        for _ in range(3):
            same_read(off, READ, "lookup", "{}", "ten")
        assert off.same_reads == 0


def same_sum(request: dict[str, Any]) -> dict[str, Any]:
    """add(2, 3) whenever tools are offered; an answer when none are."""
    if "tools" not in request:
        return text_reply("The sum is 5.")
    return tool_reply((f"s{len(request['messages'])}", "add", {"a": 2, "b": 3}))


async def test_the_same_read_again_and_again_ends_in_the_answer(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = same_sum
    async with running_worker(client, task_queue, db.url, [make_service(max_round_trips=8)],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add 2 and 3")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "The sum is 5."
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * (ANSWER_AFTER + 1)
    *offered, asked = fake_llm.requests
    assert all("tools" in r for r in offered) and len(offered) == ANSWER_AFTER + 1
    assert "tools" not in asked
    assert asked["messages"][-1] == {"role": "user", "content": READ_AGAIN_NOW}
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
    assert READ_AGAIN_NOW not in str(fake_llm.requests)


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


@pytest.mark.parametrize("answer", ["", "add(2, 3)"])
async def test_the_answer_asked_for_goes_through_the_usual_checks(
        client: Client, task_queue: str, tmp_path: Any, fake_llm: FakeOpenAIServer,
        answer: str) -> None:
    """An empty answer is asked for once more (then `EmptyAnswer`); any other
    text is the answer, checked like every answer."""
    fake_llm.default = lambda r: same_sum(r) if "tools" in r else text_reply(answer)
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service(max_round_trips=8)], llm_url=fake_llm.url) as turns:
        result = await turns.run("add 2 and 3")
    if answer:
        assert result.status == TurnStatus.COMPLETED and result.answer == answer, result.error
    else:
        assert result.status == TurnStatus.FAILED
        assert result.error is not None and result.error.type == "EmptyAnswer"
    assert len(result.tool_calls) == ANSWER_AFTER + 1  # never the round-trip cap
