"""Honest endings: a cut answer is not a complete one."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.engine.contract import TurnStatus
from turnstile.engine.endings import CONTINUATION_PROMPT
from turnstile.engine.pipeline_spec import PipelinePolicy
from turnstile.providers import OpenAICompatibleProvider
from turnstile.testing import FakeOpenAIServer, text_reply


def ended(text: str | None, reason: str) -> dict[str, Any]:
    reply = text_reply(text or "")
    reply["choices"][0]["finish_reason"] = reason
    reply["choices"][0]["message"]["content"] = text
    return reply


async def test_length_then_stop_is_one_answer(client: Client, task_queue: str, tmp_path,
                                              fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(ended("The customers are C1, C2", "length"), ended(" and C3.", "stop"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("who?")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "The customers are C1, C2 and C3."
    first, second = fake_llm.requests
    assert "tools" in first and "tools" not in second  # the continuation offers no tools
    assert second["messages"][-1] == {"role": "user", "content": CONTINUATION_PROMPT}
    assert second["messages"][-2]["content"] == "The customers are C1, C2"
    assert not fake_llm.refusals


async def test_length_twice_ends_truncated_with_what_was_received(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(ended("part one,", "length"), ended(" part two,", "length"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("long story please")
        # The next turn of the conversation works (memory stays valid).
        fake_llm.script(text_reply("short now"))
        after = await turns.run("shorter")
    assert result.status == TurnStatus.TRUNCATED
    assert result.answer == "part one, part two,"
    assert result.error is not None and result.error.type == "AnswerTruncated"
    assert len(fake_llm.requests) == 3  # one continuation, no more
    assert after.status == TurnStatus.COMPLETED and after.answer == "short now"
    assert CONTINUATION_PROMPT not in str(fake_llm.requests[2]["messages"])  # never stored


async def test_content_filter_ends_moderated(client: Client, task_queue: str, tmp_path,
                                             fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(ended(None, "content_filter"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("something filtered")
        fake_llm.script(text_reply("fine"))
        after = await turns.run("something else")
    assert result.status == TurnStatus.MODERATED
    assert result.error is not None and result.error.type == "ContentFiltered"
    assert "content filter" in str(result.answer)
    assert after.status == TurnStatus.COMPLETED
    # The withheld answer is not sent back to the model in later turns.
    assert [m["role"] for m in fake_llm.requests[1]["messages"]].count("assistant") == 0


@pytest.mark.parametrize("where", ["between events", "mid-line"])
async def test_stream_cut_before_done_is_retried(client: Client, task_queue: str, tmp_path,
                                                 fake_llm: FakeOpenAIServer, where: str) -> None:
    """A connection that drops is the same network failure wherever it falls:
    between two events or inside one (a half-sent `data:` line)."""
    service = make_service()
    service.pipeline = PipelinePolicy(streaming=True)
    fake_llm.cut_streams = 1
    fake_llm.cut_mid_line = where == "mid-line"
    fake_llm.script(text_reply("a complete answer, at last"),
                    text_reply("a complete answer, at last"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("stream it")
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "a complete answer, at last"
    assert len(fake_llm.requests) == 2 and all(r["stream"] for r in fake_llm.requests)
    # The retry is Temporal's: the second attempt records why the first failed.
    history = await handle.fetch_history()
    retried = [e.activity_task_started_event_attributes for e in history.events
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
               and e.activity_task_started_event_attributes.attempt == 2]
    assert [a.last_failure.application_failure_info.type for a in retried] == [
        "IncompleteStream"]


async def test_oversized_response_is_a_clear_error(client: Client, task_queue: str, tmp_path,
                                                   fake_llm: FakeOpenAIServer) -> None:
    provider = OpenAICompatibleProvider(fake_llm.url, max_response_bytes=4096)
    fake_llm.script(text_reply("x" * 100_000))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], provider=provider) as turns:
        result = await turns.run("say a lot")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "ModelResponseTooLarge"
    assert "4,096" in result.error.message
    assert len(fake_llm.requests) == 1  # not retried: the same request would do the same


async def test_oversized_stream_is_a_clear_error(client: Client, task_queue: str, tmp_path,
                                                 fake_llm: FakeOpenAIServer) -> None:
    service = make_service()
    service.pipeline = PipelinePolicy(streaming=True)
    provider = OpenAICompatibleProvider(fake_llm.url, max_response_bytes=4096)
    fake_llm.script(text_reply("y" * 100_000))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              provider=provider) as turns:
        result = await turns.run("stream a lot")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "ModelResponseTooLarge"
    assert "streamed model response exceeded 4,096 bytes" in result.error.message
    assert len(fake_llm.requests) == 1


async def test_bounded_lines_splits_across_chunks_and_stops_at_the_limit() -> None:
    import pytest

    from turnstile.engine.errors import ModelResponseTooLarge
    from turnstile.providers.openai_stream import bounded_lines

    async def chunks(*parts: bytes) -> Any:
        for p in parts:
            yield p

    got = [line async for line in bounded_lines(
        chunks(b"data: {\"a\"", b": \"\xc3", b"\xa9\"}\r\n\r\ndata: [DONE]"), 1000)]
    assert got == ['data: {"a": "é"}', "", "data: [DONE]"]
    with pytest.raises(ModelResponseTooLarge):
        _ = [line async for line in bounded_lines(chunks(b"x" * 600, b"y" * 600), 1000)]
