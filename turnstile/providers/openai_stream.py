"""Server-sent events of a streamed Chat Completion (`stream: true`).

Chunks carry `choices[0].delta` with `content` pieces and `tool_calls` pieces
keyed by `index` (id and name first, then argument text in fragments); the
last chunk before `data: [DONE]` may carry `usage` with empty choices. The
pieces are assembled into the body a non-streamed completion would have had,
so one parser (`parse_completion`) validates both.

A stream is complete when it sent `data: [DONE]` or a chunk with a
`finish_reason`; one that ends before either (a dropped connection, a server
restart) is `IncompleteStream`, a failed attempt that Temporal retries —
wherever the cut falls, between two events or inside a line.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from turnstile.engine.errors import (
    MalformedModelResponse,
    ModelResponseTooLarge,
    ModelUnavailable,
)


class IncompleteStream(ModelUnavailable):
    error_type = "IncompleteStream"


async def bounded_lines(chunks: AsyncIterator[bytes], max_bytes: int) -> AsyncIterator[str]:
    """Lines of a byte stream, refusing more than `max_bytes` in all (a server
    that never stops, or one line without an end, is not read forever)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    total, buffer = 0, ""
    async for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            raise ModelResponseTooLarge(
                f"the streamed model response exceeded {max_bytes:,} bytes; it was not read "
                "further (raise max_response_bytes if answers this long are expected)")
        buffer += decoder.decode(chunk)
        *lines, buffer = buffer.split("\n")
        for line in lines:
            yield line.rstrip("\r")
    buffer += decoder.decode(b"", final=True)
    if buffer.strip():
        # The stream ended inside a line: the connection dropped mid-event (a
        # server that ends its last line without a newline has sent a whole
        # `data: [DONE]` or a whole JSON chunk; anything else is cut).
        line = buffer.rstrip("\r")
        data = line[5:].strip() if line.startswith("data:") else None
        if data is None or (data != "[DONE]" and not _is_json(data)):
            raise IncompleteStream(
                "the model's stream ended in the middle of a line "
                f"({total:,} bytes received); the attempt is retried")
        yield line


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _arguments_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


async def read_sse(lines: AsyncIterator[str],
                   on_text: Callable[[str], Awaitable[None]]) -> dict[str, Any]:
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish_reason: str | None = None
    usage: dict[str, Any] = {}
    model = ""
    done = False
    async for line in lines:
        if not line.startswith("data:"):
            continue  # comments (": keep-alive"), event names, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            raise MalformedModelResponse(f"stream chunk is not JSON: {data[:300]}") from exc
        if not isinstance(chunk, dict):
            raise MalformedModelResponse(f"stream chunk is not an object: {data[:300]}")
        if "error" in chunk:
            raise MalformedModelResponse(f"stream reported an error: {data[:300]}")
        model = str(chunk.get("model") or model)
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            finish_reason = choice.get("finish_reason") or finish_reason
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                content.append(piece)
                await on_text(piece)
            for raw in delta.get("tool_calls") or []:
                index = raw.get("index")
                slot = calls.setdefault(int(index) if index is not None else len(calls),
                                        {"id": "", "type": "function",
                                         "function": {"name": "", "arguments": ""}})
                slot["id"] = raw.get("id") or slot["id"]
                fn = raw.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += _arguments_text(fn.get("arguments"))
    if not done and finish_reason is None:
        raise IncompleteStream(
            "the model's stream ended before `data: [DONE]` or a final chunk "
            f"({len(''.join(content)):,} characters received); the attempt is retried")
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(content) if content else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"model": model, "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}
