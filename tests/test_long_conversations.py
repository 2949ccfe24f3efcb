"""Long conversations and large results stay within the window.

Asserted on the bytes the strict fake model server received: it refuses, as a
real endpoint does, a request above its context (`max_request_bytes`), one
that is not a valid Chat Completions request, or one with a tool call
separated from its result.
"""

from __future__ import annotations

import json
import math

import pytest
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.memory_window import DEFAULT_TOOL_RESULT_MAX_BYTES, MemoryWindow
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.providers.tokens import DEFAULT_CONTEXT_TOKENS, estimate_tokens, window_tokens
from turnstile.sales.sales_tools import createEmailTask, querySalesData
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

CONTEXT_BYTES = 64 * 1024  # the fake endpoint's "context": larger requests get a 400


def _history(n: int) -> list[ChatMessage]:
    """n stored messages: user/assistant pairs with a tool round every 10th pair."""
    out: list[ChatMessage] = []
    i = 0
    while len(out) < n:
        out.append(ChatMessage(role="user", content=f"question {i}: " + "lorem ipsum " * 6))
        if i % 10 == 9:
            cid = f"call_{i}"  # ids repeat nothing here, but pairing is what matters
            out.append(ChatMessage(role="assistant", tool_calls=[
                ToolCall(id=cid, name="add", arguments='{"a": 1, "b": 2}')]))
            out.append(ChatMessage(role="tool", tool_call_id=cid, content='{"sum": 3}',
                                   attributes={"turnstile.tool_name": "add"}))
        out.append(ChatMessage(role="assistant", content=f"answer {i}: " + "dolor sit " * 6))
        i += 1
    return out[:n]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_ten_thousand_messages_send_a_window(client: Client, task_queue: str, tmp_path,
                                                   fake_llm: FakeOpenAIServer, backend: str,
                                                   request: pytest.FixtureRequest) -> None:
    url = (f"sqlite:///{tmp_path}/t.db" if backend == "sqlite"
           else request.getfixturevalue("postgres_url"))
    conversation = f"long-{task_queue}"
    fake_llm.max_request_bytes = CONTEXT_BYTES
    fake_llm.script(text_reply("still here"))
    async with running_worker(client, task_queue, url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        memory = turns.rt.memory
        memory.check_owner(conversation, "alice")
        stored = _history(10_000)
        memory.append(conversation, 0, stored, "seed")
        result = await turns.run("and now?", conversation=conversation)
        kept = memory.messages(conversation)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "still here"
    [req] = fake_llm.requests
    assert not fake_llm.refusals and req["_bytes"] <= CONTEXT_BYTES
    sent = req["messages"]
    # The default window: sized for the model (no name: 8,192 tokens of context).
    budget = window_tokens(DEFAULT_CONTEXT_TOKENS)
    assert sum(estimate_tokens(m.get("content") or "") for m in sent) <= budget
    assert 20 < len(sent) < 1000
    assert sent[0]["role"] == "system" and sent[-1] == {"role": "user", "content": "and now?"}
    # The newest stored messages are the ones sent, in order, the oldest left out.
    assert sent[-2]["content"] == stored[-1].content
    assert "question 0:" not in json.dumps(sent)
    # Memory itself stays whole: 10,000 + system + user + answer.
    assert len(kept) == 10_003


async def test_window_by_message_count_keeps_calls_with_results(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    service = make_service()
    service.memory = MemoryWindow(max_messages=7)
    conversation = f"count-{task_queue}"
    fake_llm.script(text_reply("ok"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        turns.rt.memory.check_owner(conversation, "alice")
        turns.rt.memory.append(conversation, 0, _history(200), "seed")
        result = await turns.run("next", conversation=conversation)
    assert result.status == TurnStatus.COMPLETED, result.error
    sent = fake_llm.requests[0]["messages"]
    assert not fake_llm.refusals  # the strict server checks every call has its result
    assert sent[0]["role"] == "system" and len(sent) - 1 <= 7
    assert sent[-1]["content"] == "next"


async def test_ten_megabyte_tool_result_is_capped_for_the_model(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.max_request_bytes = CONTEXT_BYTES
    fake_llm.script(tool_reply(("c1", "bigResult", {"megabytes": 10})), text_reply("done"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("give me everything", conversation=f"big-{task_queue}")
        result = await handle.result()
        stored = turns.rt.memory.messages(f"big-{task_queue}")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.tool_calls[0].status == CallStatus.COMPLETED
    assert not fake_llm.refusals
    second = fake_llm.requests[1]
    assert second["_bytes"] <= CONTEXT_BYTES
    [tool_msg] = [m for m in second["messages"] if m["role"] == "tool"]
    content = tool_msg["content"]
    # 16 KB by default, and at most a quarter of the window (8k model: 4,608 bytes).
    assert len(content.encode()) <= min(DEFAULT_TOOL_RESULT_MAX_BYTES,
                                        window_tokens(DEFAULT_CONTEXT_TOKENS) * 3 // 4)
    total = 10 * 1024 * 1024
    left_out = total - len(content.split("\n[…")[0])
    assert f"{left_out:,} of {total:,} bytes of this bigResult result were left out" in content
    # The full result is kept in memory.
    [full] = [m for m in stored if m.role == "tool"]
    assert full.content is not None and len(full.content) == total


def test_argument_bounds_are_argument_errors_the_model_can_fix() -> None:
    from turnstile.engine.errors import ToolArgumentError

    week = '"startDate": "2026-11-23", "endDate": "2026-11-29"'
    cases = [
        (querySalesData, '{' + week + ', "minAmount": "1e-1000000"}', "minAmount"),
        (querySalesData, '{' + week + ', "minAmount": "0.0000001"}', "decimal places"),
        (querySalesData, '{' + week + ', "minAmount": ' + "9" * 5000 + '}', "5,000 characters"),
        (createEmailTask, json.dumps({"to": "ops@example.com", "subject": "s" * 1_000_000,
                                      "body": "hi"}), "above this tool's limit"),
        (createEmailTask, json.dumps({"to": "ops@example.com", "subject": "s" * 5000,
                                      "body": "hi"}), "subject"),
        (querySalesData, "[" * 30_000 + "]" * 30_000, "nested too deeply"),
    ]
    for tool, raw, says in cases:
        with pytest.raises(ToolArgumentError) as err:
            tool.parse_arguments(raw)
        assert says in str(err.value), (raw[:60], str(err.value)[:300])
        assert len(str(err.value)) < 2000  # the error itself is small enough to send back
    ok = querySalesData.parse_arguments('{' + week + ', "minAmount": "50000.50"}')
    assert str(ok.minAmount) == "50000.50"  # type: ignore[attr-defined]
    assert math.isclose(float(ok.minAmount), 50000.5)  # type: ignore[attr-defined]


async def test_tool_call_ids_reused_across_turns(client: Client, task_queue: str, tmp_path,
                                                 fake_llm: FakeOpenAIServer) -> None:
    """Servers that number tool calls per response (`call_0` every turn) still
    give requests a strict endpoint accepts, and each result stays with its call."""
    fake_llm.script(tool_reply(("call_0", "add", {"a": 1, "b": 1})), text_reply("2"),
                    tool_reply(("call_0", "add", {"a": 2, "b": 2})), text_reply("4"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        first = await turns.run("1+1?", conversation=f"ids-{task_queue}")
        second = await turns.run("2+2?", conversation=f"ids-{task_queue}")
    assert (first.answer, second.answer) == ("2", "4")
    assert not fake_llm.refusals
    last = fake_llm.requests[-1]["messages"]
    results = [m["content"] for m in last if m["role"] == "tool"]
    assert results == ['{"sum": 2}', '{"sum": 4}']
