"""Spans: model and tool calls carry GenAI attributes; replay emits no duplicates."""

from __future__ import annotations

from collections import Counter

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support.services import make_service
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker
from turnstile.engine.contract import TurnStatus
from turnstile.runtime.tracing import interceptors
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.workflows import AgentTurn


async def test_spans_once_per_call_even_when_every_task_replays(
        temporal_server: DevServer, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,
        spans: InMemorySpanExporter) -> None:
    client = await Client.connect(temporal_server.address, interceptors=interceptors(),
                                  data_converter=pydantic_data_converter)
    fake_llm.script(tool_reply(("c1", "add", {"a": 1, "b": 2}), ("c2", "echo", {"text": "hi"})),
                    text_reply("3"))
    spans.clear()
    # max_cached_workflows=0: every workflow task replays the history from the start.
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url,
                              max_cached_workflows=0) as turns:
        handle = await turns.start("add and echo")
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED
    names = Counter(s.name for s in spans.get_finished_spans())
    assert names["RunWorkflow:AgentTurn"] == 1
    assert names["chat openai-compatible"] == 2
    assert names["execute_tool add"] == 1 and names["execute_tool echo"] == 1
    assert names["StartActivity:turnstile.execute_tool"] == 2
    model = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    assert len(model) == 2
    assert model[0].attributes["gen_ai.operation.name"] == "chat"
    assert model[0].attributes["gen_ai.usage.input_tokens"] == 10
    assert model[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    tool = next(s for s in spans.get_finished_spans() if s.name == "execute_tool add")
    assert tool.attributes["gen_ai.tool.call.id"] == "c1"
    assert tool.attributes["turnstile.tool.outcome"] == "completed"
    assert tool.attributes["turnstile.tool.attempt"] == 1

    # Replaying the recorded history emits no span at all.
    history = await handle.fetch_history()
    spans.clear()
    replayer = Replayer(workflows=[AgentTurn], interceptors=interceptors(),
                        data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    assert spans.get_finished_spans() == ()


def test_span_file_lines_are_to_json_objects(tmp_path) -> None:
    """The JSON-lines exporter writes what ReadableSpan.to_json() says, built
    without re-parsing the resource per span."""
    import json

    from opentelemetry import trace as trace_api
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Link, Status, StatusCode

    from turnstile.runtime.tracing import JsonLinesSpanExporter

    exported: list[ReadableSpan] = []

    class Keep(JsonLinesSpanExporter):
        def export(self, batch):  # type: ignore[no-untyped-def]
            exported.extend(batch)
            return super().export(batch)

    provider = TracerProvider(resource=Resource.create({"service.name": "t", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(Keep(tmp_path / "traces.jsonl")))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outer", attributes={"a": 1, "l": ["x", "y"]}) as outer:
        with tracer.start_as_current_span("inner", kind=trace_api.SpanKind.CLIENT,
                                          links=[Link(outer.get_span_context(), {"k": "v"})]
                                          ) as inner:
            inner.add_event("ev", {"b": True, "f": 1.5})
            inner.set_status(Status(StatusCode.ERROR, "broke"))
    with tracer.start_as_current_span("plain"):
        pass
    lines = (tmp_path / "traces.jsonl").read_text().splitlines()
    written = [json.loads(line) for line in lines]
    assert [w["name"] for w in written] == ["inner", "outer", "plain"]
    assert written[0]["status"] == {"status_code": "ERROR", "description": "broke"}
    assert written[0]["parent_id"] == written[1]["context"]["span_id"]
    assert written[0]["links"][0]["context"] == written[1]["context"]
    assert written[0]["resource"]["attributes"]["service.name"] == "t"
    # The same objects as the SDK's own serialization, key for key.
    assert written == [json.loads(span.to_json()) for span in exported]
