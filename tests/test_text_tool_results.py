"""`ModelSettings(tool_results="text")`: for a server whose chat
template drops `role: tool` (llama-cpp-python's chatml-function-calling), the
request carries the assistant's calls in its text and their results as a user
message, so the model sees what its calls returned. The strict scripted
server (official request types, every tool call answered) accepts it; memory
keeps real calls and results. Real turns: HTTP, a Temporal dev server, SQLite
and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from tests.support.databases import BACKENDS, worker_database_url
from tests.support.services import make_service
from tests.support.sql import fetchall
from tests.support.turns import running_worker
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.engine.model_settings import ModelSettings
from turnstile.providers.openai_compat import calls_as_text
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


@pytest.mark.parametrize("backend", BACKENDS)
async def test_results_travel_as_text_and_memory_keeps_calls(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    service = make_service()
    service.model = ModelSettings(tool_results="text")
    fake_llm.script(tool_reply(("a1", "add", {"a": 1, "b": 2}), ("e1", "echo", {"text": "hi"})),
                    text_reply("3, and hi."))
    async with running_worker(client, task_queue, worker_database_url(backend, request, tmp_path),
                              [service], llm_url=fake_llm.url) as turns:
        result = await turns.run("add 1 and 2, then echo hi", conversation="c-text")
        with turns.rt.db.connect() as conn:
            roles = [r["role"] for r in fetchall(
                conn, "SELECT role FROM chat_message WHERE conversation_id = 'c-text'"
                      " ORDER BY seq")]
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [(c.name, c.status) for c in result.tool_calls] == [
        ("add", CallStatus.COMPLETED), ("echo", CallStatus.COMPLETED)]
    sent = fake_llm.requests[1]["messages"]
    assert all(m["role"] != "tool" and "tool_calls" not in m for m in sent)
    called, results = sent[-2], sent[-1]
    assert called["role"] == "assistant"
    assert "Called add [call a1] with" in called["content"]
    assert "Called echo [call e1]" in called["content"]
    assert results["role"] == "user"
    assert results["content"].startswith("Result of add [call a1]:\n")
    assert "Result of echo [call e1]:\n" in results["content"]
    assert not fake_llm.refusals
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant"]


def test_an_error_result_says_so_and_other_messages_pass_unchanged() -> None:
    messages = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="u"),
                ChatMessage(role="assistant", content="Let me look.",
                            tool_calls=[ToolCall(id="c1", name="find", arguments='{"q": 1}')]),
                ChatMessage(role="tool", tool_call_id="c1", content="boom", is_error=True),
                ChatMessage(role="assistant", content="It failed.")]
    out = calls_as_text(messages)
    assert [m.role for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert out[2].content == 'Let me look.\nCalled find [call c1] with {"q": 1}'
    assert out[2].tool_calls == []
    assert out[3].content == "Result of find [call c1] (error):\nboom"
    assert out[0] is messages[0] and out[4] is messages[4]
