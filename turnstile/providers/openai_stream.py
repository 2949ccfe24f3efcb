"""Server-sent events of a streamed Chat Completion (`stream: true`).

Chunks carry `choices[0].delta` with `content` pieces and `tool_calls` pieces
keyed by `index` (id and name first, then argument text in fragments); the
last chunk before `data: [DONE]` may carry `usage` with empty choices. The
pieces are assembled into the body a non-streamed completion would have had,
so one parser (`parse_completion`) validates both.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from turnstile.engine.errors import MalformedModelResponse


async def read_sse(lines: AsyncIterator[str],
                   on_text: Callable[[str], Awaitable[None]]) -> dict[str, Any]:
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish_reason: str | None = None
    usage: dict[str, Any] = {}
    model = ""
    async for line in lines:
        if not line.startswith("data:"):
            continue  # comments (": keep-alive"), event names, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
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
                slot = calls.setdefault(int(raw.get("index", len(calls))),
                                        {"id": "", "type": "function",
                                         "function": {"name": "", "arguments": ""}})
                slot["id"] = raw.get("id") or slot["id"]
                fn = raw.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(content) if content else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"model": model, "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}
