"""Real-endpoint conformance.

Requests: every kind of request the OpenAI-compatible provider sends (plain,
tools, tool results, response_format, streaming, images by URL and inline,
a continuation) is captured on a real socket and validated against the
official OpenAI Chat Completions request types (`openai` package).

Responses: shapes real servers produce (vLLM, Ollama, llama.cpp's server,
LM Studio), kept in tests/data/responses with their source, parse into the
message they mean, streamed and not.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from turnstile.engine.endings import CONTINUATION_PROMPT
from turnstile.engine.messages import Attachment, ChatMessage, ToolCall
from turnstile.engine.specs import ToolSpec
from turnstile.providers import ModelRequest, OpenAICompatibleProvider
from turnstile.providers.openai_compat import parse_completion
from turnstile.providers.openai_stream import read_sse
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.testing.openai_conformance import violations

SAMPLES = sorted((Path(__file__).parent / "data" / "responses").glob("*.json"))

TOOL = ToolSpec(name="querySalesData", description="Sales records in a date range.",
                parameters={"type": "object", "properties": {
                    "startDate": {"type": "string", "format": "date"},
                    "minAmount": {"type": "string", "maxLength": 24}},
                    "required": ["startDate"], "additionalProperties": False})
SYSTEM = ChatMessage(role="system", content="You are the sales assistant.")
USER = ChatMessage(role="user", content="Who bought more than 50,000 last week?")
CALL = ChatMessage(role="assistant", content=None, tool_calls=[
    ToolCall(id="call_1", name="querySalesData", arguments='{"startDate": "2026-11-23"}'),
    ToolCall(id="call_2", name="querySalesData", arguments="{}")])
RESULTS = [ChatMessage(role="tool", tool_call_id="call_1", content='{"totalCount": 3}'),
           ChatMessage(role="tool", tool_call_id="call_2", content="", is_error=True)]
ANSWER = ChatMessage(role="assistant", content="Three customers.")

KINDS: dict[str, ModelRequest] = {
    "plain": ModelRequest(messages=[SYSTEM, USER]),
    "tools": ModelRequest(messages=[SYSTEM, USER], tools=[TOOL]),
    "tool_results": ModelRequest(messages=[SYSTEM, USER, CALL, *RESULTS], tools=[TOOL]),
    "response_format": ModelRequest(
        messages=[SYSTEM, USER], response_format={"type": "json_schema", "json_schema": {
            "name": "Answer", "schema": {"type": "object",
                                         "properties": {"text": {"type": "string"}}}}}),
    "multimodal": ModelRequest(messages=[SYSTEM, USER.model_copy(update={"parts": [
        Attachment(type="image_url", url="https://example.com/chart.png"),
        Attachment(type="image_base64", data="iVBORw0KGgo=", mime_type="image/png")]})]),
    "continuation": ModelRequest(messages=[SYSTEM, USER, CALL, *RESULTS, ANSWER, ChatMessage(
        role="user", content=CONTINUATION_PROMPT)]),
}


def _sent(fake: FakeOpenAIServer) -> dict[str, Any]:
    assert not fake.refusals, fake.refusals
    return {k: v for k, v in fake.requests[-1].items() if not k.startswith("_")}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
async def test_request_conforms_to_openai_types(kind: str, streamed: bool,
                                                fake_llm: FakeOpenAIServer) -> None:
    provider = OpenAICompatibleProvider(fake_llm.url, model="gpt-4o-mini")
    fake_llm.script(text_reply("ok"))

    async def ignore(_: str) -> None:
        return None

    try:
        if streamed:
            await provider.stream(KINDS[kind], ignore)
        else:
            await provider.complete(KINDS[kind])
    finally:
        await provider.aclose()
    body = _sent(fake_llm)
    assert body["model"] == "gpt-4o-mini" and bool(body.get("stream")) is streamed
    assert violations(body) == []
    if kind == "multimodal":
        parts = body["messages"][1]["content"]
        assert [p["type"] for p in parts] == ["text", "image_url", "image_url"]


def test_the_checker_refuses_what_openai_refuses() -> None:
    """The conformance check is not vacuous: each of these is a known 400."""
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert violations(ok) == []
    bad = [
        {"messages": [{"role": "user", "content": "hi"}]},  # no model
        {**ok, "messages": [{"role": "user", "content": "hi", "is_error": True}]},  # our field
        {**ok, "messages": [{"role": "assistant", "tool_calls": [  # arguments as an object
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]},
            {"role": "tool", "tool_call_id": "c", "content": ""}]},
        {**ok, "messages": [{"role": "assistant", "tool_calls": [  # call without result
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "user", "content": "next"}]},
        {**ok, "messages": [{"role": "tool", "tool_call_id": "x", "content": "orphan"}]},
        {**ok, "tools": [{"type": "function", "function": {"name": "f"}, "extra": 1}]},
        {**ok, "stream_options": {"include_usage": True}, "stream": "yes"},
    ]
    for body in bad:
        assert violations(body), body


def _lines(raw: list[str]) -> AsyncIterator[str]:
    async def gen() -> AsyncIterator[str]:
        for line in raw:
            yield line
    return gen()


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
async def test_real_server_response_parses(path: Path) -> None:
    sample = json.loads(path.read_text())
    assert sample["source"].startswith("https://"), "every sample names where it came from"
    received: list[str] = []

    async def on_text(piece: str) -> None:
        received.append(piece)

    if "sse" in sample:
        response = parse_completion(await read_sse(_lines(sample["sse"]), on_text))
    else:
        response = parse_completion(sample["body"])
    expect = sample["expect"]
    assert response.message.content == expect["content"]
    assert response.finish_reason == expect["finish_reason"]
    got = [{"id": c.id, "name": c.name, "arguments": json.loads(c.arguments)}
           for c in response.message.tool_calls]
    assert got == expect["tool_calls"]
    if "sse" in sample and expect["content"]:
        assert "".join(received) == expect["content"]


async def test_tool_call_ids_reused_across_turns_stay_paired(fake_llm: FakeOpenAIServer) -> None:
    """llama.cpp and several fine-tunes restart tool-call ids each turn: two
    rounds both using `call_0` still form a request a strict endpoint takes."""
    provider = OpenAICompatibleProvider(fake_llm.url, model="m")
    turn1 = [ChatMessage(role="assistant", tool_calls=[ToolCall(id="call_0", name="q")]),
             ChatMessage(role="tool", tool_call_id="call_0", content="1")]
    fake_llm.script(tool_reply(("call_0", "q", {})))
    try:
        response = await provider.complete(ModelRequest(
            messages=[SYSTEM, USER, *turn1, ANSWER, USER, *turn1], tools=[TOOL]))
    finally:
        await provider.aclose()
    assert violations(_sent(fake_llm)) == []
    assert response.message.tool_calls[0].id == "call_0"
