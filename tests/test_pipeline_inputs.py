"""Steps 2, 4, 5 (memory option), 6 and 17 through real turns."""

from __future__ import annotations

import asyncio
import base64
from datetime import date
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client

from tests.support.pipeline_services import DOCUMENTS, pipeline_service
from tests.support.turns import local_activities, running_worker
from turnstile.activities import turn as turn_activities
from turnstile.engine import attributes as attr
from turnstile.engine.contract import TurnStatus
from turnstile.engine.events import TurnCompleted, TurnStarted
from turnstile.engine.messages import Attachment
from turnstile.engine.pipeline_spec import PipelinePolicy
from turnstile.runtime.event_bus import OpenTelemetryListener
from turnstile.runtime.services import SystemMessageContext
from turnstile.stores.memory import MemoryStore
from turnstile.stores.retrieval_index import FullTextRetriever, RetrievalContext
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64).decode()


def db_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path}/t.db"


def with_today(ctx: SystemMessageContext) -> str:
    """A real transformer: the date comes from the worker's clock, never the workflow's."""
    return f"{ctx.system_message}\nToday is {date.today().isoformat()} (user {ctx.user_id})."


async def test_system_transformer_runs_in_an_activity(client: Client, task_queue: str,
                                                      tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(text_reply("ok"))
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [pipeline_service(system_transformer=with_today)],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("hi", service="pipeline")
    assert result.status == TurnStatus.COMPLETED
    system = fake_llm.requests[0]["messages"][0]
    assert system["content"] == ("You are a test assistant for qa.\n"
                                 f"Today is {date.today().isoformat()} (user alice).")


async def test_attachments_become_content_parts(client: Client, task_queue: str, tmp_path,
                                                fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(text_reply("a chart"), text_reply("still a chart"))
    parts = [Attachment(type="image_url", url="https://example.com/chart.png"),
             Attachment(type="image_base64", data=PNG, mime_type="image/png")]
    async with running_worker(client, task_queue, db_url(tmp_path), [pipeline_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.client.start_workflow(
            "AgentTurn", {"conversation_id": "c-img", "user_id": "alice",
                          "message": "what is this?", "service": "pipeline",
                          "variables": {"team": "qa"},
                          "attachments": [p.model_dump(exclude_none=True) for p in parts]},
            id=f"t-img-{task_queue}", task_queue=task_queue)
        await handle.result()
        again = await turns.run("and now?", service="pipeline", conversation="c-img")
    assert again.status == TurnStatus.COMPLETED
    user = fake_llm.requests[0]["messages"][1]
    assert user["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/chart.png"}},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
    # Stored in memory: the next turn's request still carries the images.
    assert fake_llm.requests[1]["messages"][1]["content"] == user["content"]


async def test_too_much_inline_data_is_refused(client: Client, task_queue: str, tmp_path,
                                               fake_llm: FakeOpenAIServer) -> None:
    big = Attachment(type="image_base64", data="A" * 2000, mime_type="image/png")
    async with running_worker(
            client, task_queue, db_url(tmp_path),
            [pipeline_service(policy=PipelinePolicy(max_inline_attachment_chars=1000))],
            llm_url=fake_llm.url) as turns:
        handle = await turns.client.start_workflow(
            "AgentTurn", {"conversation_id": "c-big", "user_id": "alice", "message": "see",
                          "service": "pipeline", "variables": {"team": "qa"},
                          "attachments": [big.model_dump()]},
            id=f"t-big-{task_queue}", task_queue=task_queue)
        result = await handle.result()
    assert result["status"] == "failed"
    assert result["error"]["type"] == "AttachmentError"
    message = result["error"]["message"]
    assert "limit is 1000" in message and "https URL" in message
    assert fake_llm.requests == []


async def test_memory_can_keep_the_original_user_message(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("c1", "echo", {"text": "x"})), text_reply("two days"),
                    text_reply("you asked about follow-ups"))
    service = pipeline_service(documents=DOCUMENTS,
                               policy=PipelinePolicy(retrieval_memory="original"))
    question = "How fast must key accounts get a follow-up call?"
    async with running_worker(client, task_queue, db_url(tmp_path), [service],
                              llm_url=fake_llm.url) as turns:
        await turns.run(question, service="pipeline", conversation="c-orig")
        await turns.run("what did I ask?", service="pipeline", conversation="c-orig")
        stored = MemoryStore(turns.rt.db).messages("c-orig")
    # Every model call of the first turn read the augmented message...
    for request in fake_llm.requests[:2]:
        assert "two business days" in request["messages"][1]["content"]
    # ...memory keeps the user's words, so the next turn sees only those.
    assert fake_llm.requests[2]["messages"][1]["content"] == question
    assert stored[1].content == question
    assert "two business days" in stored[1].attributes[attr.AUGMENTED_USER_MESSAGE]


async def test_events_once_each_even_under_replay(client: Client, task_queue: str, tmp_path,
                                                  fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("c1", "add", {"a": 1, "b": 2})), text_reply("3"))
    received: list[TurnStarted | TurnCompleted] = []
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with running_worker(client, task_queue, db_url(tmp_path), [pipeline_service()],
                              llm_url=fake_llm.url, max_cached_workflows=0) as turns:
        turns.rt.events.listeners += [received.append, OpenTelemetryListener(provider)]
        handle = await turns.start("1+2?", service="pipeline", conversation="c-ev")
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED
    # Every workflow task replayed the turn from the start: still one event of each kind.
    assert [e.kind for e in received] == ["turn_started", "turn_completed"]
    started, done = received
    assert isinstance(done, TurnCompleted)
    assert started.workflow_id == done.workflow_id == handle.id
    assert done.conversation_id == "c-ev" and done.status == "completed"
    assert done.round_trips == 1 and done.tool_calls == 1
    assert done.usage.model_dump() == {"prompt_tokens": 20, "completion_tokens": 10}
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"turnstile.turn_started", "turnstile.turn_completed"}
    assert spans["turnstile.turn_completed"].attributes["turnstile.status"] == "completed"


async def test_failed_turns_and_failing_listeners(client: Client, task_queue: str, tmp_path,
                                                  fake_llm: FakeOpenAIServer) -> None:
    received: list[TurnStarted | TurnCompleted] = []

    def broken(_event: TurnStarted | TurnCompleted) -> None:
        raise RuntimeError("listener down")

    fake_llm.script(tool_reply(("m1", "mustSucceed", {})))
    async with running_worker(client, task_queue, db_url(tmp_path), [pipeline_service()],
                              llm_url=fake_llm.url) as turns:
        turns.rt.events.listeners += [broken, received.append]
        result = await turns.run("go", service="pipeline")
    assert result.status == TurnStatus.FAILED  # the listener's error changed nothing
    assert [e.kind for e in received] == ["turn_started", "turn_completed"]
    assert isinstance(received[1], TurnCompleted)
    assert received[1].status == "failed" and received[1].error_type == "FatalToolFailure"


class FailsOnce:
    """A retriever whose first call fails (an index not reachable yet)."""

    def __init__(self) -> None:
        self.calls = 0
        self.inner = FullTextRetriever(DOCUMENTS)

    def __call__(self, ctx: RetrievalContext) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("index not reachable yet")
        return self.inner(ctx)


class SlowOnce(FailsOnce):
    """A retriever whose first answer takes longer than begin_turn waits."""

    async def __call__(self, ctx: RetrievalContext) -> Any:  # type: ignore[override]
        self.calls += 1
        if self.calls == 1:
            await asyncio.sleep(2)
        return self.inner(ctx)


@pytest.mark.parametrize("case", ["plain", "transformer", "retriever fails once",
                                  "retriever slow once"])
async def test_begin_turn_runs_steps_4_and_5_unless_something_comes_between(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer, case: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Revision 2: begin_turn, once it holds the conversation, delivers "turn
    started" and retrieves for the user message as step 3 renders it. With a
    system transformer (step 2 runs first), or a retriever that fails there or
    outlasts begin_turn's budget for it, step 5 is the `retrieve` local
    activity, with its own timeout and retries; the user message is augmented
    the same way and each event goes out once."""
    monkeypatch.setattr(turn_activities, "RETRIEVAL_BUDGET_SECONDS", 0.5)
    components: dict[str, Any] = {"documents": DOCUMENTS}
    if case == "transformer":
        components["system_transformer"] = with_today
    flaky = SlowOnce() if case == "retriever slow once" else FailsOnce()
    if case.startswith("retriever"):
        components["retriever"] = flaky
    received: list[TurnStarted | TurnCompleted] = []
    fake_llm.script(text_reply("ok"))
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [pipeline_service(**components)], llm_url=fake_llm.url,
                              max_cached_workflows=0) as turns:
        turns.rt.events.listeners.append(received.append)
        handle = await turns.start("How fast do key accounts get a follow-up call?",
                                   service="pipeline", conversation="c-open")
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    user = fake_llm.requests[0]["messages"][1]["content"]
    assert "personal follow-up call" in user  # the retrieved policy, in the user message
    assert [e.kind for e in received] == ["turn_started", "turn_completed"]
    assert received[0].service == "pipeline"
    local = await local_activities(handle)
    assert local[0] == "turnstile.begin_turn" and "turnstile.publish_event" not in local
    assert ("turnstile.retrieve" in local) == (case != "plain")
    assert flaky.calls == (2 if case.startswith("retriever") else 0)
