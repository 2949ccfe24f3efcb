"""Requests checked against the official OpenAI Chat Completions request types
(what turnstile.testing.FakeOpenAIServer refuses).

The `openai` package (the `testing` extra: `pip install 'turnstile[testing]'`)
types every request parameter as a TypedDict. Validating a body with pydantic
in strict mode, then comparing the validated value with the body, catches both
wrong shapes and keys the API does not define (pydantic drops unknown
TypedDict keys, so they show up as a difference). On top of the types: the
pairing rule real endpoints enforce (every assistant tool call is answered by
a tool message before the next message, and every tool message answers such
a call).

One extension is allowed: `response_format: {"type": "json_object",
"schema": {...}}`, the form llama.cpp's servers constrain by (llama-cpp-python
reads no other; constrained tool calls send it). The schema must be an object.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from pydantic import TypeAdapter, ValidationError

_NON_STREAMING: TypeAdapter[Any] = TypeAdapter(CompletionCreateParamsNonStreaming)
_STREAMING: TypeAdapter[Any] = TypeAdapter(CompletionCreateParamsStreaming)


def _materialize(value: Any) -> Any:
    """pydantic validates `Iterable[...]` fields lazily: iterate them (which
    validates each item) into lists."""
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_materialize(v) for v in value]
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    return [_materialize(v) for v in value]  # a ValidatorIterator


def _difference(sent: Any, known: Any, path: str = "") -> str | None:
    if isinstance(sent, dict) and isinstance(known, dict):
        extra = sorted(set(sent) - set(known))
        if extra:
            return f"{path or '(body)'}: keys the OpenAI types do not define: {extra}"
        for k in sent:
            d = _difference(sent[k], known[k], f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    if isinstance(sent, list) and isinstance(known, list):
        for i, (a, b) in enumerate(zip(sent, known, strict=False)):
            d = _difference(a, b, f"{path}[{i}]")
            if d:
                return d
        return None if len(sent) == len(known) else f"{path}: length differs"
    return None if sent == known else f"{path}: {sent!r} is read as {known!r}"


def pairing_violations(messages: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            cid = m.get("tool_call_id")
            if cid not in open_calls:
                problems.append(f"messages[{i}]: tool message answers no preceding tool call "
                                f"({cid!r})")
            open_calls.discard(cid)
            continue
        if open_calls:
            problems.append(f"messages[{i}]: tool call(s) {sorted(open_calls)} have no result "
                            "before the next message")
            open_calls = set()
        if role == "assistant":
            open_calls = {c["id"] for c in m.get("tool_calls") or []}
    if open_calls:
        problems.append(f"tool call(s) {sorted(open_calls)} have no result")
    return problems


def violations(body: dict[str, Any]) -> list[str]:
    """What makes `body` not a valid Chat Completions request ([] when valid)."""
    adapter = _STREAMING if body.get("stream") else _NON_STREAMING
    fmt = body.get("response_format")
    extension: list[str] = []
    if isinstance(fmt, dict) and fmt.get("type") == "json_object" and "schema" in fmt:
        if not isinstance(fmt["schema"], dict):
            extension.append("response_format.schema: not an object")
        body = {**body, "response_format": {"type": "json_object"}}
    try:
        known = _materialize(adapter.validate_python(body, strict=True))
    except ValidationError as exc:
        return [str(exc)]
    problems = extension + ([d] if (d := _difference(body, known)) else [])
    return problems + pairing_violations(list(body.get("messages") or []))
