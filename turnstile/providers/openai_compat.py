"""OpenAI-compatible Chat Completions over httpx (OpenAI, vLLM, Ollama,
llama.cpp's llama-server...).

Temporal owns retries: this client never retries by itself. It classifies
each failure instead: 429/5xx/network are `ModelUnavailable` (retryable, with
the server's Retry-After) — a 5xx whose body says the request is invalid is
`InvalidRequestAnswer`, which the model activity stops retrying after a few
identical answers (`ModelServerRefused`); a 5xx saying the server could not
parse the model's own output is `ModelOutputUnparsed`, not retried —, other 4xx are
`ModelRequestRejected`, and a body that is not a usable completion is
`MalformedModelResponse`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pydantic_core

from turnstile.engine import attributes as attr, constrained_calls
from turnstile.engine.approvals import note_of_edits
from turnstile.engine.errors import (
    MalformedModelResponse,
    ModelOutputUnparsed,
    ModelRequestRejected,
    ModelResponseTooLarge,
    ModelUnavailable,
)
from turnstile.engine.messages import ChatMessage, ToolCall, Usage
from turnstile.engine.model_settings import SchemaDialect
from turnstile.engine.safe_text import safe_text
from turnstile.engine.schema_dialect import DEFAULT_DIALECT
from turnstile.providers.base import ModelRequest, ModelResponse
from turnstile.providers.http_transport import ModelServerTransport
from turnstile.providers.openai_stream import IncompleteStream, bounded_lines, read_sse
from turnstile.providers.wire_tools import wire_tools

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024

log = logging.getLogger(__name__)


class RetryableModelError(ModelUnavailable):
    """A ModelUnavailable that carries the provider's Retry-After."""

    error_type = ModelUnavailable.error_type  # the stable name, not this class's

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class InvalidRequestAnswer(RetryableModelError):
    """A 5xx whose body says the request is invalid (a validation error):
    retried, but only while the server's answers differ
    (activities/model_refusals.py ends the turn after MODEL_REFUSAL_LIMIT
    identical ones). `fingerprint` names the answer: status and body, with
    ids, numbers and spacing left out."""

    error_type = ModelUnavailable.error_type

    def __init__(self, message: str, status: int = 500, body: str = "",
                 retry_after: float | None = None) -> None:
        super().__init__(message, retry_after)
        self.status = status
        self.body = body
        self.fingerprint = answer_fingerprint(status, body)


# Words a server's error body uses when the request itself is invalid
# (pydantic's "1 validation error for ...", "Input should be a valid string",
# "Field required"; OpenAI's "invalid_request_error"; llama.cpp's "failed to
# parse"). A gateway's 502/503 page or "Loading model" has none of them.
_INVALID_REQUEST_WORDS = re.compile(
    r"validation error|input should be|field required|value is not a valid|"
    r"invalid_request_error|invalid request|unprocessable|failed to parse", re.I)
# The server could not parse the model's own output (it answers 5xx without
# the text): llama-server's "The model produced output that does not match
# the expected peg-native format", older builds' "Failed to parse input at pos".
_UNPARSED_OUTPUT = re.compile(
    r"does not match the expected [\w-]+ format|failed to parse input at pos", re.I)
_VOLATILE = re.compile(r"[0-9a-f]{8,}(?:-[0-9a-f]{4,})*|\d+", re.I)


def says_invalid_request(body: str) -> bool:
    """The error body says the request is invalid (not that the server is down)."""
    return _INVALID_REQUEST_WORDS.search(body) is not None


def answer_fingerprint(status: int, body: str) -> str:
    """The same for two answers that differ only in ids, numbers or spacing."""
    normal = " ".join(_VOLATILE.sub("#", body.lower()).split())
    return hashlib.sha256(f"{status} {normal}".encode()).hexdigest()[:32]


class IncompleteStreamError(RetryableModelError):
    """The stream ended before `[DONE]` or a final chunk: a failed attempt."""

    error_type = IncompleteStream.error_type


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds (delta-seconds or HTTP date), None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def wire_arguments(arguments: str) -> str:
    """A call's arguments as sent back in a later request: valid JSON.
    A server that renders the history with the model's chat template parses
    them (llama-server `--jinja` answers 500 "Failed to parse tool call
    arguments as JSON" to the whole request), so a call a model wrote with
    no arguments (a dead end) or with text that does not parse (an argument
    error it is asked to correct) goes back as `{}`, or as an object that
    carries the text it wrote. Memory and the ledger keep them as written."""
    try:
        json.loads(arguments, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        if not arguments.strip():
            return "{}"
        return json.dumps({"_unparsed": arguments}, ensure_ascii=False)
    return arguments


def to_openai_message(m: ChatMessage) -> dict[str, Any]:
    # Content is never null on the wire: beside tool calls it is "" (
    # llama-cpp-python refuses null there with a 500; OpenAI, vLLM, Ollama and
    # llama-server take ""), and a message without text is "" everywhere.
    out: dict[str, Any] = {"role": m.role, "content": m.content or ""}
    if m.role == "user" and m.parts:
        # Step 6: images go after the text, in the content-parts format.
        out["content"] = [{"type": "text", "text": m.content or ""}] + [
            {"type": "image_url", "image_url": {"url": p.as_url()}} for p in m.parts]
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": wire_arguments(c.arguments)}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
    return out


def with_edit_notes(messages: list[ChatMessage]) -> list[ChatMessage]:
    """After each run of tool results, one user message with a note for every
    call of the run a reviewer approved with edits (attribute
    `turnstile.edited`): the tool message stays the tool's own result, and
    the note is a message of its own. A user message right after tool results
    is what every Chat Completions endpoint accepts (a `system` message there
    is refused by several local servers' templates). Unchanged (the same
    list) when no call was edited."""
    if not any(m.role == "tool" and attr.EDITED in m.attributes for m in messages):
        return messages
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    out: list[ChatMessage] = []
    notes: list[str] = []
    for m in messages:
        if m.role != "tool" and notes:
            out.append(ChatMessage(role="user", content="\n".join(notes)))
            notes = []
        out.append(m)
        edits = m.attributes.get(attr.EDITED) if m.role == "tool" else None
        if isinstance(edits, dict):
            call_id = m.tool_call_id or ""
            notes.append(note_of_edits(edits, call_id, names.get(call_id, "a tool")))
    if notes:
        out.append(ChatMessage(role="user", content="\n".join(notes)))
    return out


def calls_as_text(messages: list[ChatMessage]) -> list[ChatMessage]:
    """`ModelSettings.tool_results="text"`: each assistant message's tool calls
    written into its text ("Called NAME [call ID] with ARGS"), and each run of
    tool results as one user message ("Result of NAME [call ID]: ..."), so a
    server whose template drops `role: tool` still shows the model what its
    calls returned. The request stays valid Chat Completions."""
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    out: list[ChatMessage] = []
    results: ChatMessage | None = None  # the user message of the current run of results
    for m in messages:
        if m.role != "tool":
            results = None
        if m.role == "assistant" and m.tool_calls:
            lines = [m.content] if m.content else []
            lines += [f"Called {c.name} [call {c.id}] with {c.arguments}" for c in m.tool_calls]
            out.append(ChatMessage(role="assistant", content="\n".join(lines)))
        elif m.role == "tool":
            name = names.get(m.tool_call_id or "", "a tool")
            error = " (error)" if m.is_error else ""
            text = f"Result of {name} [call {m.tool_call_id}]{error}:\n{m.content or ''}"
            if results is None:
                results = ChatMessage(role="user", content=text)
                out.append(results)
            else:
                results.content = f"{results.content}\n\n{text}"
        else:
            out.append(m)
    return out


def parse_completion(body: Any) -> ModelResponse:
    """Read choices[0].message.{content,tool_calls}; anything else is malformed."""
    try:
        choice = body["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise MalformedModelResponse(
            f"completion has no choices[0].message: {str(body)[:300]}"
        ) from exc
    if not isinstance(msg, dict):
        raise MalformedModelResponse("choices[0].message is not an object")
    content = msg.get("content")
    if isinstance(content, list):
        # Content parts (some servers answer in the request's part format).
        content = "".join(p.get("text") or "" for p in content
                          if isinstance(p, dict) and p.get("type") == "text")
    if content is not None and not isinstance(content, str):
        raise MalformedModelResponse("choices[0].message.content is not a string")
    calls: list[ToolCall] = []
    raw_calls = msg.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise MalformedModelResponse("choices[0].message.tool_calls is not a list")
    for i, raw in enumerate(raw_calls):
        fn = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(fn, dict):
            raise MalformedModelResponse(f"tool_calls[{i}] has no function object")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            # Some servers send an object instead of the JSON text OpenAI specifies.
            args = json.dumps(args)
        # Made safe here, where text enters (turnstile.engine.safe_text).
        calls.append(ToolCall(id=safe_text(str(raw.get("id") or "")),
                              name=safe_text(str(fn.get("name") or "")),
                              arguments=safe_text(args)))
    usage = body.get("usage") or {}
    return ModelResponse(
        message=ChatMessage(role="assistant",
                            content=None if content is None else safe_text(content),
                            tool_calls=calls),
        usage=Usage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        ),
        finish_reason=choice.get("finish_reason"),
        model=str(body.get("model") or ""),
    )


def _text(body: bytes, limit: int) -> str:
    return body[: limit * 4].decode("utf-8", errors="replace")[:limit]


def _body(payload: dict[str, Any]) -> bytes:
    """The request body: compact UTF-8 JSON, as httpx's `json=` writes it,
    by pydantic-core's encoder (a quarter of the stdlib's time on a
    request with tools and a conversation: bench/README.md)."""
    return pydantic_core.to_json(payload)


class OpenAICompatibleProvider:
    name = "openai-compatible"
    # Step 9: send the JSON schema as `response_format` (OpenAI, vLLM,
    # llama-server and Ollama take it); False appends format instructions.
    supports_response_format = True

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        timeout_seconds: float = 120.0,
        supports_response_format: bool = True,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        schema_dialect: SchemaDialect = DEFAULT_DIALECT,
    ) -> None:
        self.supports_response_format = supports_response_format
        # How tool schemas are written for a service that does not choose
        # (LLM_SCHEMA_DIALECT; turnstile.engine.schema_dialect).
        self.schema_dialect: SchemaDialect = schema_dialect
        self.max_response_bytes = max_response_bytes
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._endpoint: tuple[str, httpx.URL] | None = None
        # Every request is a JSON POST: the body is encoded here (`_body`).
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # Temporal's activity retry policy is the only retry layer; the
        # transport (turnstile/providers/http_transport.py: asyncio and h11,
        # a fifth of httpcore's CPU per request) resends only a request a
        # stale kept-alive connection never answered.
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_seconds, connect=10.0),
            transport=ModelServerTransport(),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _chat_url(self) -> tuple[str, httpx.URL]:
        """The endpoint as text (for messages) and as an httpx.URL parsed once
        per base_url: httpx parses a str URL on every request (~60 us)."""
        url = f"{self.base_url}/chat/completions"
        if self._endpoint is None or self._endpoint[0] != url:
            self._endpoint = (url, httpx.URL(url))
        return self._endpoint

    def payload(self, request: ModelRequest) -> dict[str, Any]:
        noted = with_edit_notes(request.messages)
        messages = calls_as_text(noted) if request.tool_results == "text" else noted
        constrained = (request.constrain_tool_calls and bool(request.tools)
                       and not request.response_format)
        if constrained:  # the tools as a schema (turnstile.engine.constrained_calls)
            # Named in the one system message (chat templates take one, first).
            listing = constrained_calls.tool_list(request.tools)
            if messages and messages[0].role == "system":
                first = messages[0].model_copy(
                    update={"content": f"{messages[0].content or ''}\n\n{listing}".lstrip()})
                messages = [first, *messages[1:]]
            else:
                messages = [ChatMessage(role="system", content=listing), *messages]
        body: dict[str, Any] = {"messages": [to_openai_message(m) for m in messages]}
        if self.model:
            body["model"] = self.model
        if constrained:
            body["response_format"] = constrained_calls.response_format(
                request.tools, request.schema_dialect or self.schema_dialect,
                request.tool_choice, one_call=not request.parallel_tool_calls)
        elif request.tools:
            dialect = request.schema_dialect or self.schema_dialect
            body["tools"] = wire_tools(request.tools, dialect)
            body["tool_choice"] = request.tool_choice
            if not request.parallel_tool_calls:
                body["parallel_tool_calls"] = False
        if request.response_format:
            body["response_format"] = request.response_format
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        return body

    async def complete(self, request: ModelRequest) -> ModelResponse:
        url, parsed = self._chat_url()
        try:
            async with self._client.stream("POST", parsed,
                                           content=_body(self.payload(request))) as resp:
                raw = await self._read_bounded(resp)
        except httpx.TransportError as exc:
            raise RetryableModelError(f"model endpoint {url} unreachable: {exc!r}") from exc
        self._raise_for_status(resp, raw)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise MalformedModelResponse(
                f"model endpoint sent non-JSON: {raw[:300]!r}") from exc
        return parse_completion(body)

    async def _read_bounded(self, resp: httpx.Response) -> bytes:
        """The body, or ModelResponseTooLarge once it passes `max_response_bytes`
        (never an unbounded read into memory)."""
        limit = self.max_response_bytes
        declared = resp.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ModelResponseTooLarge(
                f"the model response declares {int(declared):,} bytes, above the limit of "
                f"{limit:,}; it was not read")
        parts, total = [], 0
        async for chunk in resp.aiter_bytes():
            total += len(chunk)
            if total > limit:
                raise ModelResponseTooLarge(
                    f"the model response exceeded {limit:,} bytes; it was not read further")
            parts.append(chunk)
        return b"".join(parts)

    async def stream(self, request: ModelRequest,
                     on_text: Callable[[str], Awaitable[None]]) -> ModelResponse:
        """Step 8: the same request with `stream: true`; each content delta is
        handed to `on_text` as it arrives, the assembled message returned."""
        body = {**self.payload(request), "stream": True,
                "stream_options": {"include_usage": True}}
        url, parsed = self._chat_url()
        try:
            async with self._client.stream("POST", parsed, content=_body(body)) as resp:
                if resp.status_code >= 400:
                    self._raise_for_status(resp, await self._read_bounded(resp))
                lines = bounded_lines(resp.aiter_bytes(), self.max_response_bytes)
                return parse_completion(await read_sse(lines, on_text))
        except IncompleteStream as exc:
            raise IncompleteStreamError(str(exc)) from exc
        except httpx.TransportError as exc:
            # A connection dropped mid-stream: also an incomplete answer, retried.
            raise RetryableModelError(f"model endpoint {url} unreachable: {exc!r}") from exc

    @staticmethod
    def _raise_for_status(resp: httpx.Response, body: bytes) -> None:
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if resp.status_code >= 500:
            text = _text(body, 2000)
            if _UNPARSED_OUTPUT.search(text):
                raise ModelOutputUnparsed(
                    f"the model server could not read the model's reply in its format and "
                    f"answered {resp.status_code} (not retried: the same request asks the "
                    f"same of the model; a reply cut at max_tokens inside the "
                    f"response_format JSON is one cause): {text[:300]}")
            if says_invalid_request(text):
                raise InvalidRequestAnswer(
                    f"model endpoint answered {resp.status_code}: {text[:300]}",
                    resp.status_code, text, retry_after=retry_after)
        if resp.status_code == 429 or resp.status_code >= 500:
            raise RetryableModelError(
                f"model endpoint answered {resp.status_code}: {_text(body, 300)}",
                retry_after=retry_after,
            )
        if resp.status_code >= 400:
            raise ModelRequestRejected(
                f"model endpoint refused the request with {resp.status_code}: {_text(body, 500)}"
            )
