"""Constrained tool calls (`ModelSettings.constrain_tool_calls`):
for a server that constrains its output to a JSON schema (llama.cpp's
llama-server and llama-cpp-python compile `response_format`'s schema, in the
json_object form both read, into a grammar), the request asks for "one of
these tool calls, or a final answer" instead of offering `tools`:

    {"answer": "..."}
    {"tool_calls": [{"name": "querySalesData", "arguments": {...}}, ...]}

Each call's `arguments` schema is the tool's in the grammar dialect
(turnstile.engine.schema_dialect), so the server can compile it; the tools'
names and descriptions go to the model in a system message (`tool_list`).
The reply is read back as calls or an answer (`read_reply`); the arguments
are still validated against the tool's full schema when the call runs. A
reply that is not such JSON stays text (and the loop's rules for text apply:
turnstile.engine.dead_ends, `ToolCallAsText`).

Pure functions; used by the provider (the request) and the model activity
(the reply).
"""

from __future__ import annotations

import json
from typing import Any

from turnstile.engine.model_settings import SchemaDialect
from turnstile.engine.schema_dialect import wire_parameters
from turnstile.engine.specs import ToolSpec

TOOL_LIST_HEAD = (
    "Reply with JSON only: {\"answer\": \"...\"} to answer the user, or {\"tool_calls\": "
    "[{\"name\": TOOL, \"arguments\": {...}}]} to call tools. The tools:")
# Replies longer than this are not read as calls (the activity's bound).
READ_LIMIT = 256 * 1024


def chosen_tool(tool_choice: str | dict[str, Any]) -> str | None:
    """The tool a request's `tool_choice` names (`{"type": "function",
    "function": {"name": ...}}`), None for "auto", "required" and "none"."""
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return str(function["name"])
    return None


def reply_schema(tools: list[ToolSpec], dialect: SchemaDialect = "grammar",
                 tool_choice: str | dict[str, Any] = "auto", *,
                 one_call: bool = False) -> dict[str, Any]:
    """The JSON schema of a reply: an answer, or one or more calls of `tools`.
    `tool_choice` applies as it does to `tools`: "required" leaves the answer
    out (the reply is calls), a tool's name leaves out the answer and every
    other tool (a name not among `tools` changes nothing), "none" leaves the
    calls out. `one_call` (`ModelSettings.parallel_tool_calls=False`): at most
    one call per reply."""
    named = chosen_tool(tool_choice)
    narrowed = named is not None and any(t.name == named for t in tools)
    if narrowed:
        tools = [t for t in tools if t.name == named]
    calls = [{"type": "object", "properties": {
                 "name": {"type": "string", "enum": [t.name]},
                 "arguments": wire_parameters(t.parameters, dialect) or {"type": "object"}},
              "required": ["name", "arguments"]} for t in tools]
    answer = {"type": "object", "properties": {"answer": {"type": "string"}},
              "required": ["answer"]}
    items: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if one_call:
        items["maxItems"] = 1
    call_list = {"type": "object", "properties": {"tool_calls": items},
                 "required": ["tool_calls"]}
    if tool_choice == "none":
        return answer
    if tool_choice == "required" or narrowed:
        return call_list
    return {"anyOf": [answer, call_list]}


def response_format(tools: list[ToolSpec], dialect: SchemaDialect = "grammar",
                    tool_choice: str | dict[str, Any] = "auto", *,
                    one_call: bool = False) -> dict[str, Any]:
    """The request's `response_format`: `{"type": "json_object", "schema":
    ...}`, the form both llama.cpp servers constrain by. llama-cpp-python
    0.3.36's server refuses OpenAI's `{"type": "json_schema", ...}` (a 500:
    "Input should be 'text' or 'json_object'", measured); llama-server reads
    both alike (tests/test_grammar_conformance.py)."""
    return {"type": "json_object",
            "schema": reply_schema(tools, dialect, tool_choice, one_call=one_call)}


def tool_list(tools: list[ToolSpec]) -> str:
    """The system message that names the tools the reply may call."""
    lines = [TOOL_LIST_HEAD]
    for t in tools:
        required = t.parameters.get("required") or []
        props = ", ".join(
            f"{name}{'' if name in required else '?'}"
            for name in (t.parameters.get("properties") or {}))
        lines.append(f"- {t.name}({props}): {t.description}".rstrip(": "))
    return "\n".join(lines)


def read_reply(content: str) -> tuple[str | None, list[tuple[str, str]]] | None:
    """A constrained reply: (the answer, None) or (None, the calls as (name,
    arguments JSON text)); None when `content` is not such a reply."""
    if len(content) > READ_LIMIT:
        return None
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("answer"), str) and "tool_calls" not in value:
        return value["answer"], []
    raw = value.get("tool_calls")
    if not isinstance(raw, list) or not raw:
        return None
    calls = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = item.get("arguments", {})
        calls.append((item["name"], args if isinstance(args, str)
                      else json.dumps(args, ensure_ascii=False)))
    return None, calls
