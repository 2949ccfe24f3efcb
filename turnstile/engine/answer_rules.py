"""Honest endings for final answers that are not answers, pure.

- **Empty.** A final answer with no text (or only whitespace) and no tool
  calls is not `completed`: the empty answer is discarded and the model is
  asked once more, without tools, with `EMPTY_NUDGE` sent after the stored
  conversation (never stored). Still empty: the turn ends `failed` with
  `EmptyAnswer`; what the tools did is kept. (chatml-function-calling's
  grammar in llama-cpp-python makes every text answer empty while tools are
  offered; asked without tools, the model can write one.)
- **A tool call written as text.** An answer that is only a call of an
  offered tool written as JSON (```json {"name": ..., "arguments": ...}```,
  `<tool_call>...</tool_call>`, `<tools>...</tools>`, `<function ...>` tags,
  chatml-function-calling's `functions.NAME:` followed by its arguments,
  bare, or several such calls one after another) ends the turn `failed` with
  `ToolCallAsText`; the call is never run (a model whose server's chat
  template does not parse its tool calls writes them so).
- **A call that does not parse** (`unparsed_call`): a bare `functions.NAME:`
  with no arguments, or a JSON block naming an offered tool that is not a
  call (`{{"name": "createEmailTask", ...}}}`, measured) is not a call. From
  revision 6 it is a dead end (turnstile.engine.dead_ends); turns begun
  earlier read a bare `functions.NAME:` as a call with `{}` (`bare_heads`).

- **A tool result written by the model** (`fabricated_result`): an answer
  that writes a tool-result block anywhere in it — `<tool_response>` (Hermes,
  Qwen2.5/Qwen3's templates; measured from Qwen2.5-Coder-1.5B under
  llama-server, a made-up `{"taskId": ..., "status": "QUEUED"}` for a
  createEmailTask never called), `<tool_result>`, `<function_results>` or
  `<function_result>` (opening or closing tag), Mistral v0.3's
  `[TOOL_RESULTS]`, Llama 3.1/3.2's `ipython` role header, or the line our own
  `ModelSettings.tool_results="text"` writes for a result (`Result of NAME
  [call ID]:`, turnstile.providers.openai_compat.calls_as_text) — tells the
  user a tool returned what no tool returned. From revision 9 it is not an
  answer: discarded, asked once more without tools with `FABRICATED_NUDGE`
  (never stored); a made-up result again ends the turn `failed` with
  `FabricatedToolResult`, naming what it wrote. A block quoted in an
  otherwise honest answer (in a code fence, or a model explaining the
  format) counts too: nothing in the text tells a quoted example from a
  made-up result, the measured model fences its output, and a false alarm
  costs one re-ask (whose nudge asks for no result tags) or an honest
  `failed`, where a miss lets the user believe an effect that did not
  happen. Mentions without the tag or header (the words "tool response")
  are not blocks.

Deterministic and cheap: safe in workflow code (answers longer than
`SCAN_LIMIT` are not scanned for a call; `fabricated_result` scans the first
and last `SCAN_LIMIT` characters of a longer answer).
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

FABRICATED_NUDGE = (
    "Your last reply wrote a tool result itself. Tool results come only from the tools: "
    "nothing you write as a result was run or returned. Do not write tool results or "
    "result tags. Answer the user's request now, in plain text, from the real tool results "
    "above, and say plainly what was not done.")
FABRICATED_MESSAGE = (
    "the model wrote a tool result itself ({what}), also when asked once more without "
    "tools: no tool returned it, so its answer was not given (what the tools did is kept)")

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
# llama-cpp-python's chatml-function-calling: `functions.NAME:` then JSON.
_CHATML_HEAD = re.compile(r"functions\.([A-Za-z0-9_-]+):\s*")
# `<function name="X" arguments='{...}'/>` and `<function=X>{...}</function>`.
_FUNCTION_TAG = re.compile(
    r"""<function\s+name="([^"]+)"\s+arguments=(?:'(.*?)'|"(.*?)")\s*/?>"""
    r"|<function=([A-Za-z0-9_.-]+)>(.*?)(?:</function>|\Z)", re.S)
# A tool named in a block that is not a call (`unparsed_call`).
_NAMED = re.compile(r"""["']?name["']?\s*[:=]\s*["']([A-Za-z0-9_.-]+)["']"""
                    r"|<function=([A-Za-z0-9_.-]+)")


# Tool-result blocks as chat templates render them, so a model that writes
# one makes up what a tool returned: the tags (opening or closing; a name
# attribute allowed), Mistral v0.3's `[TOOL_RESULTS]`, Llama 3.1/3.2's
# `ipython` header, and `calls_as_text`'s `Result of NAME [call ID] (error):`.
# Every repetition is bounded, so a search is linear in the text.
_RESULT = re.compile(
    r"</?(?:tool_responses?|tool_results?|function_results?)\b[^<>\n]{0,200}>"
    r"|\[/?TOOL_RESULTS\]"
    r"|<\|start_header_id\|>[ \t]{0,8}ipython[ \t]{0,8}<\|end_header_id\|>"
    r"|\bResult of [^\n\[\]]{1,200} \[call [^\[\]\n]{0,200}\](?: \(error\))?:",
    re.I)
# How much of the result block an error names (cut and masked by the caller,
# turnstile.engine.masking.mask_prefix, so an address is never cut in half
# unmasked).
EXCERPT_CHARS = 80


def fabricated_result(text: str) -> str | None:
    """The tool-result block `text` writes, from its marker on (at most
    `4 * EXCERPT_CHARS` characters of the answer, whitespace collapsed), or
    None for an answer that writes none. Anywhere in the text, fenced or not;
    an answer longer than 2 x `SCAN_LIMIT` is scanned at its first and last
    `SCAN_LIMIT` characters."""
    windows = ([text] if len(text) <= 2 * SCAN_LIMIT
               else [text[:SCAN_LIMIT], text[-SCAN_LIMIT:]])
    for window in windows:
        found = _RESULT.search(window)
        if found is not None:
            return " ".join(window[found.start():found.start() + 4 * EXCERPT_CHARS].split())
    return None


def is_empty(text: str) -> bool:
    return not text.strip()


def tool_call_as_text(text: str, offered: list[str], bare_heads: bool = False) -> str | None:
    """The name of the offered tool `text` calls instead of calling it; None
    when the text is an answer. `bare_heads`: a bare `functions.NAME:` is a
    call with `{}` (the rule of turns begun before revision 6)."""
    calls = calls_written_as_text(text, offered, bare_heads)
    return calls[0][0] if calls else None


def calls_written_as_text(text: str, offered: list[str],
                          bare_heads: bool = False) -> list[tuple[str, str]]:
    """Every call of an offered tool that `text` writes, as (name, arguments
    as JSON text), when the answer is only calls (at most `AROUND_LIMIT`
    characters of other text); empty otherwise. For `ToolCallAsText` and for
    `ModelSettings.text_tool_calls` (the model activity turns them into tool
    calls, so validation, review and the journal treat them as any call)."""
    if len(text) > SCAN_LIMIT or not offered:
        return []
    blocks = [a or b for a, b in _BLOCK.findall(text)]
    around = _BLOCK.sub("", text).strip()
    if not blocks:
        blocks, around = [text], ""
    if len(around) > AROUND_LIMIT:
        return []
    names = set(offered)
    return [(name, args) for block in blocks
            for name, args in _calls_in(block.strip(), bare_heads) if name in names]


def unparsed_call(text: str, offered: list[str]) -> str | None:
    """The offered tool `text` tries to call without writing a call that
    parses: a bare `functions.NAME:` (or one whose arguments are not JSON),
    or a block that names an offered tool (`"name": "NAME"`) but is not a
    call. None when the text writes a call that parses (that is
    `calls_written_as_text`'s) or is an answer. Same bounds as
    `calls_written_as_text`: the answer must be only that."""
    if len(text) > SCAN_LIMIT or not offered or calls_written_as_text(text, offered):
        return None
    blocks = [a or b for a, b in _BLOCK.findall(text)]
    around = _BLOCK.sub("", text).strip()
    if not blocks:
        blocks, around = [text], ""
    if len(around) > AROUND_LIMIT:
        return None
    names = set(offered)
    for block in (b.strip() for b in blocks):
        head = _CHATML_HEAD.match(block)
        if head is not None:
            rest = block[head.end():].strip()
            if head.group(1) in names and (not rest or rest[0] in "{["):
                return head.group(1)
            continue
        if block.startswith(("{", "[")) and _parses(block):
            # JSON that parses: a call only in shape (`{"name": X}` and call
            # keys, nothing else), so a typed answer naming a tool is no call.
            for item in _flat(_values(block)):
                name = _call_shaped(item)
                if name in names:
                    return name
        elif block.startswith(("{", "[", "<function")):
            for named in _NAMED.finditer(block):
                name = named.group(1) or named.group(2)
                if name in names:
                    return name
    return None


_CALL_KEYS = frozenset({"name", "arguments", "parameters", "type", "function", "id"})


def _parses(block: str) -> bool:
    """Is `block` nothing but JSON values?"""
    at = 0
    while at < len(block):
        try:
            _, at = _DECODER.raw_decode(block, at)
        except (ValueError, RecursionError):
            return False
        while at < len(block) and block[at].isspace():
            at += 1
    return True


def _flat(values: list[Any]) -> list[Any]:
    return [i for v in values for i in (v if isinstance(v, list) else [v])]


def _call_shaped(item: Any) -> str | None:
    """The name a JSON object that has only a call's keys gives, else None."""
    if not isinstance(item, dict) or not set(item) <= _CALL_KEYS:
        return None
    if isinstance(item.get("function"), dict):
        return _call_shaped(item["function"])
    name = item.get("name")
    return name if isinstance(name, str) else None


def _calls_in(block: str, bare_heads: bool = False) -> list[tuple[str, str]]:
    """The calls `block` writes: JSON values one after another, or
    `<function name="X" arguments='{...}'/>` / `<function=X>{...}</function>`
    tags (both measured from Qwen2.5-Coder under llama-server)."""
    if block.startswith("functions."):
        return _chatml_calls(block, bare_heads)
    if block.startswith("<function"):
        found = []
        for name, single, double, bare, body in _FUNCTION_TAG.findall(block):
            args = single or double or body or "{}"
            if _values(args.strip()):
                found.append((name or bare, args.strip()))
        return found
    if not block.startswith(("{", "[")):
        return []
    found = []
    for value in _values(block):
        for item in value if isinstance(value, list) else [value]:
            call = _call(item)
            if call is not None:
                found.append(call)
    return found


def _chatml_calls(block: str, bare_heads: bool = False) -> list[tuple[str, str]]:
    """llama-cpp-python's chatml-function-calling format, `functions.NAME:`
    then the arguments as JSON, one call after another. A head without
    arguments (measured: asked for its answer without tools after a repeat,
    the model wrote only `functions.createEmailTask:`) is no call
    (`unparsed_call` names it); with `bare_heads` (turns begun before
    revision 6) it is a call with `{}`. Any other text in between: not calls."""
    found: list[tuple[str, str]] = []
    at = 0
    while at < len(block):
        head = _CHATML_HEAD.match(block, at)
        if head is None:
            return []
        at = head.end()
        args = "{}" if bare_heads else ""
        if at < len(block) and block[at] in "{[":
            try:
                value, at = _DECODER.raw_decode(block, at)
            except (ValueError, RecursionError):
                return []
            args = json.dumps(value, ensure_ascii=False)
        if args:
            found.append((head.group(1), args))
        while at < len(block) and block[at].isspace():
            at += 1
    return found


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


def _call(item: Any) -> tuple[str, str] | None:
    """`{"name", "arguments"|"parameters"}`, or OpenAI's `{"function": {...}}`."""
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str):
        return None
    for key in ("arguments", "parameters"):
        args = item.get(key)
        if isinstance(args, str):
            return name, args
        if isinstance(args, dict):
            return name, json.dumps(args, ensure_ascii=False)
    return None
