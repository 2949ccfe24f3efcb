"""Spans: model and tool calls carry GenAI attributes; replay emits no duplicates."""

from __future__ import annotations

from collections import Counter

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
from tests.support.services import make_service
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker
from turnstile.engine.contract import TurnStatus
from turnstile.runtime.tracing import interceptors
from workflows import AgentTurn


async def test_spans_once_per_call_even_when_every_task_replays(
        temporal_server: DevServer, task_queue: str, tmp_path, fake_llm: FakeLLM,
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
