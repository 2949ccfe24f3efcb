"""Step 8: streaming is decided once per turn; partial text can be followed
in `turn_stream` while the turn runs, and the history holds only the final
message, exactly as without streaming."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from temporalio.client import Client

from tests.support.pipeline_services import pipeline_service
from tests.support.turns import running_worker
from turnstile.engine.contract import TurnProgress, TurnStatus
from turnstile.engine.pipeline_spec import PipelinePolicy
from turnstile.providers import DemoPlanner
from turnstile.stores.streaming import follow_stream, read_stream
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

ANSWER = "Streaming works: this sentence arrives in small pieces over about a second."


def streaming_service():  # type: ignore[no-untyped-def]
    return pipeline_service("streamed", policy=PipelinePolicy(streaming=True))


async def test_partial_text_is_readable_while_the_turn_runs(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.stream_delay = 0.08
    fake_llm.script(tool_reply(("c1", "add", {"a": 2, "b": 3})), text_reply(ANSWER))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [streaming_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("add, then explain", service="streamed")
        partial = ""
        while not partial:  # text shows up before the turn is over
            rows = read_stream(turns.rt.db, handle.id)
            partial = "".join(r.text for r in rows if r.response_seq > 2)
            await asyncio.sleep(0.05)
        progress = await handle.query("status", result_type=TurnProgress)
        assert progress.step not in ("completed", "failed")
        assert ANSWER.startswith(partial) and partial != ANSWER
        result = await handle.result()
        rows = read_stream(turns.rt.db, handle.id)
        history = await handle.fetch_history()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == ANSWER
    # The tool call was assembled from its streamed pieces (arguments split in two).
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert all(r["stream"] is True for r in fake_llm.requests)
    final = "".join(r.text for r in rows if r.response_seq == rows[-1].response_seq)
    assert final == ANSWER and rows[-1].done == 1
    assert sum(1 for r in rows if r.response_seq == rows[-1].response_seq) > 1
    # History carries the answer as without streaming (the model activity's
    # result and the turn's result), never the pieces.
    raw = b"".join(e.SerializeToString() for e in history.events)
    assert raw.count(ANSWER.encode()) == 2 and partial.encode() not in raw.replace(
        ANSWER.encode(), b"")


async def test_follow_stream_prints_the_turn(client: Client, task_queue: str, tmp_path,
                                             fake_llm: FakeOpenAIServer) -> None:
    fake_llm.stream_delay = 0.02
    fake_llm.script(text_reply(ANSWER))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [streaming_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("explain", service="streamed")

        async def running() -> bool:
            return (await handle.describe()).status.name == "RUNNING"

        out = io.StringIO()
        chunks = await follow_stream(turns.rt.db, handle.id, running, out.write, poll=0.05)
        await handle.result()
    assert out.getvalue() == ANSWER and chunks >= 2


async def test_provider_without_streaming_writes_one_chunk(
        client: Client, task_queue: str, tmp_path) -> None:
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [streaming_service()], provider=DemoPlanner()) as turns:
        handle = await turns.start("hello", service="streamed")
        result = await handle.result()
        rows = read_stream(turns.rt.db, handle.id)
    assert result.status == TurnStatus.COMPLETED
    assert [r.text for r in rows] == [result.answer, ""]  # the text, then "done"
    assert [r.done for r in rows] == [0, 1]


async def test_without_streaming_nothing_is_buffered(client: Client, task_queue: str, tmp_path,
                                                     fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(text_reply("plain"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [pipeline_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("hello", service="pipeline")
        await handle.result()
        assert read_stream(turns.rt.db, handle.id) == []
    assert "stream" not in fake_llm.requests[0]
    assert json.loads(json.dumps(fake_llm.requests[0]["messages"]))[-1]["content"] == "hello"


async def test_starter_stream_command(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from turnstile.cli import starter

    url = f"sqlite:///{tmp_path}/t.db"
    monkeypatch.setenv("DATABASE_URL", url)
    fake_llm.stream_delay = 0.02
    fake_llm.script(text_reply(ANSWER))
    async with running_worker(client, task_queue, url, [streaming_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("explain", service="streamed")
        assert await starter.main(["stream", handle.id], client=client) == 0
    assert capsys.readouterr().out == ANSWER + "\n"


async def test_the_client_streams_the_answer_with_the_events(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    """turnstile.client: `events(text=True)` gives the partial answer of a
    streaming service as `answer_text` events, among the turn's own."""
    from turnstile.client import TurnstileClient
    from turnstile.engine.contract import TurnInput
    from turnstile.runtime.config import Settings

    fake_llm.stream_delay = 0.05
    fake_llm.script(text_reply(ANSWER))
    url = f"sqlite:///{tmp_path}/t.db"
    tc = TurnstileClient(client, Settings.from_env({"TURNSTILE_TASK_QUEUE": task_queue,
                                                    "DATABASE_URL": url}))
    async with running_worker(client, task_queue, url, [streaming_service()],
                              llm_url=fake_llm.url):
        turn = await tc.start_turn(TurnInput(conversation_id="c-stream", user_id="alice",
                                             message="explain", service="streamed",
                                             variables={"team": "qa"}))
        events = [e async for e in turn.events(text=True)]
        result = await turn.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    pieces = [e.detail for e in events if e.step == "answer_text"]
    assert len(pieces) > 1 and "".join(pieces) == ANSWER
    assert events[-1].step == "turn_completed"
    assert events.index(next(e for e in events if e.step == "answer_text")) < len(events) - 1
