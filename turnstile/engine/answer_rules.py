"""Honest endings for final answers that are not answers (issue 36), pure.

- **Empty.** A final answer with no text (or only whitespace) and no tool
  calls is not `completed`: the empty answer is discarded and the model is
  asked once more, without tools, with `EMPTY_NUDGE` sent after the stored
  conversation (never stored). Still empty: the turn ends `failed` with
  `EmptyAnswer`; what the tools did is kept. (chatml-function-calling's
  grammar in llama-cpp-python makes every text answer empty while tools are
  offered; asked without tools, the model can write one.)
- **A tool call written as text.** An answer that is only a call of an
  offered tool written as JSON (```json {"name": ..., "arguments": ...}```,
  `<tool_call>...</tool_call>`, `<tools>...</tools>`, bare, or several such
  objects one after another) ends the turn `failed` with
  `ToolCallAsText`; the call is never run (a model whose server's chat
  template does not parse its tool calls writes them so).

Deterministic and cheap: safe in workflow code (answers longer than
`SCAN_LIMIT` are not scanned for a call).
"""

from __future__ import annotations

import json
import re
from typing import Any

EMPTY_NUDGE = (
    "Your last reply was empty. Answer the user's request now, in plain text, using the "
    "conversation and the tool results above.")
EMPTY_MESSAGE = (
    "the model's answer was empty, also when asked once more without tools; nothing was "
    "answered (what the tools did is kept)")
TOOL_CALL_AS_TEXT_MESSAGE = (
    "the model wrote a call of {name} as text instead of calling the tool, so it was not "
    "run. The model server probably does not parse this model's tool calls (its chat "
    "template or tool-call format; llama.cpp's llama-server needs --jinja): "
    "docs/local-models.md")

SCAN_LIMIT = 64 * 1024
# Text around the call that still makes the answer "only a call" (a lead-in
# such as "Here is the call:").
AROUND_LIMIT = 200

# A fenced block, or a call in the tags models use for them (Hermes/Qwen
# `<tool_call>`; `<tools>` as Qwen2.5-Coder writes under llama-server's
# template, measured; `<function_call>`); a closing tag may be missing when the
# answer was cut.
_BLOCK = re.compile(
    r"```[A-Za-z]*[ \t]*\n?(.*?)(?:```|\Z)"
    r"|<(?:tool_call|tools|function_call)>(.*?)(?:</(?:tool_call|tools|function_call)>|\Z)",
    re.S)
_DECODER = json.JSONDecoder()


def is_empty(text: str) -> bool:
    return not text.strip()


def tool_call_as_text(text: str, offered: list[str]) -> str | None:
    """The name of the offered tool `text` calls in JSON instead of calling it;
    None when the text is an answer."""
    if len(text) > SCAN_LIMIT or not offered:
        return None
    blocks = [a or b for a, b in _BLOCK.findall(text)]
    around = _BLOCK.sub("", text).strip()
    if not blocks:
        blocks, around = [text], ""
    if len(around) > AROUND_LIMIT:
        return None
    for block in blocks:
        name = _called(block.strip(), set(offered))
        if name is not None:
            return name
    return None


def _called(block: str, offered: set[str]) -> str | None:
    if not block.startswith(("{", "[")):
        return None
    for value in _values(block):
        for item in value if isinstance(value, list) else [value]:
            name = _call_name(item)
            if name in offered:
                return name
    return None


def _values(block: str) -> list[Any]:
    """The JSON values written one after another in `block` (a model writes
    several calls one per line), up to the first text that is not JSON."""
    values: list[Any] = []
    at = 0
    while at < len(block):
        try:
            value, at = _DECODER.raw_decode(block, at)
        except (ValueError, RecursionError):
            break
        values.append(value)
        while at < len(block) and block[at].isspace():
            at += 1
    return values


def _call_name(item: Any) -> str | None:
    """`{"name", "arguments"|"parameters"}`, or OpenAI's `{"function": {...}}`."""
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str):
        return None
    if not any(isinstance(item.get(k), dict | str) for k in ("arguments", "parameters")):
        return None
    return name


def calls_written_as_text(text: str, offered: list[str]) -> list[tuple[str, str]]:
    """Every call of an offered tool that `text` writes, as (name, arguments
    as JSON text), when the answer is only calls (the rule of
    `tool_call_as_text`); empty otherwise. For `ModelSettings.text_tool_calls`:
    the model activity turns them into tool calls, so validation, review and
    the journal treat them as any call."""
    if tool_call_as_text(text, offered) is None:
        return []
    names = set(offered)
    blocks = [a or b for a, b in _BLOCK.findall(text)] or [text]
    calls: list[tuple[str, str]] = []
    for block in blocks:
        block = block.strip()
        if not block.startswith(("{", "[")):
            continue
        for value in _values(block):
            for item in value if isinstance(value, list) else [value]:
                name = _call_name(item)
                if name not in names:
                    continue
                assert name is not None and isinstance(item, dict)
                body = item["function"] if isinstance(item.get("function"), dict) else item
                args = body.get("arguments", body.get("parameters"))
                calls.append((name, args if isinstance(args, str)
                              else json.dumps(args, ensure_ascii=False)))
    return calls
