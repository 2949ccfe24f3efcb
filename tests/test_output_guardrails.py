"""Step 15 through real turns: pass / fail / fatal / retry / reprompt, bounded."""

from __future__ import annotations

from temporalio.client import Client

from tests.support.pipeline_services import Scripted, pipeline_service
from tests.support.turns import running_worker
from turnstile.engine import attributes as attr
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.pipeline_spec import PipelinePolicy
from turnstile.runtime.guardrails import GuardrailResult, MaxLength, PiiGuardrail
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

CARD_ANSWER = "Charged card 4111 1111 1111 1111 for the order."


def db_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path}/t.db"


def contents(request: dict) -> list[tuple[str, str | None]]:  # type: ignore[type-arg]
    return [(m["role"], m["content"]) for m in request["messages"]]


async def test_reprompt_appends_guidance_and_keeps_the_answer(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(text_reply(CARD_ANSWER), text_reply("Charged the card ending in 1111."))
    service = pipeline_service(output_guardrails=[PiiGuardrail(), MaxLength(500)])
    async with running_worker(client, task_queue, db_url(tmp_path), [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("charge it", service="pipeline", conversation="c-rp")
        stored = MemoryStore(turns.rt.db).messages("c-rp")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "Charged the card ending in 1111."
    second = contents(fake_llm.requests[1])
    assert second[-2] == ("assistant", CARD_ANSWER)  # the model sees what it said...
    assert second[-1][0] == "user" and "payment card number" in (second[-1][1] or "")
    assert stored[-2].attributes[attr.REPROMPT] == "output_guardrail:pii"  # ...and why


async def test_retry_asks_again_with_the_same_messages(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(text_reply("first draft"), text_reply("second draft"))
    service = pipeline_service(output_guardrails=[
        Scripted([GuardrailResult.retry("not good enough")])])
    async with running_worker(client, task_queue, db_url(tmp_path), [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("draft it", service="pipeline", conversation="c-retry")
        stored = MemoryStore(turns.rt.db).messages("c-retry")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "second draft"
    assert fake_llm.requests[1]["messages"] == fake_llm.requests[0]["messages"]
    # The discarded draft is never sent again, in this turn or a later one.
    assert [m.content for m in stored if m.role == "assistant"] == ["second draft"]


async def test_fail_withholds_the_answer_and_keeps_the_work(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("r1", "reserve", {"item": "table"})),
                    text_reply("Reserved. Confidential: the supplier margin is 40%."))
    refuse = Scripted([GuardrailResult.fail("The answer contained confidential data.")])
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [pipeline_service(output_guardrails=[refuse])],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("reserve a table", service="pipeline", conversation="c-f")
        stored = MemoryStore(turns.rt.db).messages("c-f")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "OutputGuardrailFailed"
    assert result.answer == "The answer contained confidential data."
    assert [(c.status, c.rolled_back) for c in result.tool_calls] == [
        (CallStatus.COMPLETED, False)]  # fail refuses the answer, not the work
    assert not any("margin" in (m.content or "") for m in stored)


async def test_fatal_withholds_the_answer_and_compensates(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("r1", "reserve", {"item": "table"})), text_reply("done"))
    fatal = Scripted([GuardrailResult.fatal("This must not have happened.")])
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [pipeline_service(output_guardrails=[fatal])],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("reserve a table", service="pipeline")
    assert result.status == TurnStatus.ROLLED_BACK
    assert result.error is not None and result.error.type == "OutputGuardrailFatal"
    assert result.answer == "This must not have happened."
    assert [(c.status, c.rolled_back) for c in result.tool_calls] == [
        (CallStatus.ROLLED_BACK, True)]


async def test_reasks_are_bounded(client: Client, task_queue: str, tmp_path,
                                  fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = text_reply(CARD_ANSWER)
    service = pipeline_service(output_guardrails=[PiiGuardrail()],
                               policy=PipelinePolicy(max_output_guardrail_reasks=2))
    async with running_worker(client, task_queue, db_url(tmp_path), [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("charge it", service="pipeline")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "OutputGuardrailRetriesExhausted"
    assert "after 2 re-ask(s)" in result.error.message
    assert len(fake_llm.requests) == 3  # the answer and two re-asks
