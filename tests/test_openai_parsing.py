"""Reading completions and classifying HTTP failures (no server needed)."""

from __future__ import annotations

import pytest

from turnstile.engine.errors import MalformedModelResponse
from turnstile.engine.messages import ChatMessage
from turnstile.providers import ModelRequest
from turnstile.providers.openai_compat import (
    OpenAICompatibleProvider,
    parse_completion,
    parse_retry_after,
)
from turnstile.stores.audit import mask
from turnstile.testing import FakeOpenAIServer, text_reply


def test_tool_calls_and_usage_are_read() -> None:
    r = parse_completion({"model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 4},
                          "choices": [{"finish_reason": "tool_calls", "message": {
                              "role": "assistant", "content": None, "tool_calls": [
                                  {"id": "a", "type": "function",
                                   "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}}]})
    assert r.message.tool_calls[0].name == "f"
    assert r.message.tool_calls[0].arguments == '{"x": 1}'
    assert r.usage.prompt_tokens == 3 and r.finish_reason == "tool_calls"


def test_object_arguments_are_normalised_to_json_text() -> None:
    r = parse_completion({"choices": [{"message": {"tool_calls": [
        {"id": "a", "function": {"name": "f", "arguments": {"x": 1}}}]}}]})
    assert r.message.tool_calls[0].arguments == '{"x": 1}'


@pytest.mark.parametrize("body", [
    {}, {"choices": []}, {"choices": [{}]}, {"choices": [{"message": "hi"}]},
    {"choices": [{"message": {"content": 5}}]},
    {"choices": [{"message": {"tool_calls": {"id": "x"}}}]},
    {"choices": [{"message": {"tool_calls": [{"id": "x"}]}}]},
])
def test_malformed_bodies_are_typed_errors(body: dict) -> None:
    with pytest.raises(MalformedModelResponse):
        parse_completion(body)


def test_retry_after_forms() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


def test_audit_masks_emails_and_phones() -> None:
    text = mask('{"to": "ops.team@example.com", "note": "call +1 (415) 555-2671", "n": 42}')
    assert "ops.team@" not in text and "o***@example.com" in text
    assert "555-26" not in text and "*********71" in text and '"n": 42' in text
    assert mask('{"startDate": "2026-11-16"}') == '{"startDate": "2026-11-16"}'


@pytest.mark.parametrize("keep_alive", [False, True])
async def test_the_provider_reuses_a_kept_alive_connection(keep_alive: bool) -> None:
    """bench/turns.py serves the model over persistent connections, as real
    endpoints do; the provider's pool reuses them, and a streamed answer
    (ended by closing its connection) still arrives whole."""
    fake = FakeOpenAIServer(keep_alive=keep_alive)
    fake.default = text_reply("hello")
    provider = OpenAICompatibleProvider(fake.url)
    request = ModelRequest(messages=[ChatMessage(role="user", content="hi")])
    try:
        for _ in range(3):
            assert (await provider.complete(request)).message.content == "hello"
        assert fake.connections == (1 if keep_alive else 3)
        parts: list[str] = []

        async def on_text(text: str) -> None:
            parts.append(text)

        streamed = await provider.stream(request, on_text)
        assert streamed.message.content == "hello" == "".join(parts)
        assert (await provider.complete(request)).message.content == "hello"
        # the stream went over the pooled connection and closed it: one new one
        assert fake.connections == (2 if keep_alive else 5)
        assert fake.refusals == []
    finally:
        await provider.aclose()
        fake.close()
