"""The labelled sources of a call's conversation, for its information-flow
rules (turnstile.engine.provenance; docs/information-flow.md): what the
model read, each text with where it came from.

- the service's system prompt and stored system messages: `system`, trusted;
- a user message: `user`, trusted — for a message augmented by retrieval,
  only the user's own text (`turnstile.raw_user_message`); the augmented
  text is `retrieval`, untrusted, one source per retrieved document when
  its block can be told apart (`[title]` blocks of the retrieval template);
- the result of a call that ran (outcome completed or failed, or a row
  without an outcome written by another program): `tool`, or `mcp` for an
  MCP server's tool, untrusted unless the tool declares `trusted_results`.
  A result is not the origin of the values its own call was given (it may
  echo them back: `LabelledSource.echoes`).
  Texts the turn wrote itself (argument errors, rejections, repeats) are
  not sources: they may echo the model's own arguments back;
- the whole values a tool vouches for (`@tool(trusted_values=...)`) in a
  result that completed and is JSON: `value`, trusted — every string and
  number (True), or those under the named keys at any depth — matched only
  as whole values (turnstile.engine.provenance);
- the arguments of a call a person approved (`approved`, read by
  turnstile.stores.person_approvals): `approval`, trusted whole values too —
  the arguments the tool ran with (the reviewer's edits, when they edited).

The model's own messages are never sources. At most the newest
`MAX_MESSAGES` messages are read.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from turnstile.engine import attributes as attr
from turnstile.engine.contract import CallStatus
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.engine.provenance import LabelledSource, echoes_of
from turnstile.engine.turn_rules import parsed_arguments
from turnstile.runtime.services import Service

MAX_MESSAGES = 400
MAX_VALUES = 5_000  # whole values taken from one result or one approved call
MAX_DEPTH = 16  # of a result walked for them
# Outcomes of a call whose message holds what the tool returned (or raised).
TOOL_TEXTS = frozenset({CallStatus.COMPLETED.value, CallStatus.FAILED.value,
                        CallStatus.INTERRUPTED.value})


def labelled(service: Service, messages: list[ChatMessage],
             approved: Collection[tuple[str, str]] = ()) -> list[LabelledSource]:
    """`approved`: the (workflow id, tool call id) of the calls a person approved."""
    sources: list[LabelledSource] = []
    if service.system_prompt:
        sources.append(LabelledSource(kind="system", trusted=True, text=service.system_prompt))
    calls: dict[str, ToolCall] = {}  # call id -> the call, from the latest assistant message
    for m in messages:
        text = m.content or ""
        if m.role == "assistant":
            calls.update((c.id, c) for c in m.tool_calls)
        elif m.role == "system":
            sources.append(LabelledSource(kind="system", trusted=True, text=text))
        elif m.role == "user":
            sources.extend(_user(m, text))
        elif m.role == "tool":
            asked = calls.get(m.tool_call_id or "")
            source = _tool(service, m, text, asked.arguments if asked else "{}")
            if source is not None:
                sources.append(source)
                vouched = _vouched(service, m, text)
                if vouched is not None:
                    sources.append(vouched)
            if approved:
                decided = _approved(m, calls, approved)
                if decided is not None:
                    sources.append(decided)
    return sources


def ran_calls(messages: list[ChatMessage]) -> list[tuple[str, str]]:
    """The (workflow id, tool call id) of the calls whose results are in `messages`."""
    out = []
    for m in messages:
        wf = m.attributes.get(attr.WORKFLOW_ID)
        if m.role == "tool" and m.tool_call_id and isinstance(wf, str) and wf:
            out.append((wf, m.tool_call_id))
    return out


def _user(m: ChatMessage, text: str) -> list[LabelledSource]:
    retrieved = m.attributes.get(attr.RETRIEVED_SOURCES)
    if not retrieved:
        return [LabelledSource(kind="user", trusted=True, text=text)]
    raw = m.attributes.get(attr.RAW_USER_MESSAGE)
    augmented = m.attributes.get(attr.AUGMENTED_USER_MESSAGE)
    full = augmented if isinstance(augmented, str) else text
    out = [LabelledSource(kind="user", trusted=True, text=raw if isinstance(raw, str) else "")]
    titles = [str(d.get("title", "")) for d in retrieved if isinstance(d, dict)] \
        if isinstance(retrieved, list) else []
    blocks = _blocks(full, titles)
    if blocks:
        out.extend(LabelledSource(kind="retrieval", trusted=False, text=body, title=title)
                   for title, body in blocks)
    else:  # the blocks cannot be told apart: the augmented text as one document
        out.append(LabelledSource(kind="retrieval", trusted=False, text=full,
                                  title=", ".join(t for t in titles[:3] if t)))
    return out


def _blocks(text: str, titles: list[str]) -> list[tuple[str, str]]:
    """Each retrieved document's `[title]` block (the retrieval template's
    form), or [] when some title is not found in order."""
    starts: list[tuple[int, str]] = []
    at = 0
    for title in titles:
        mark = f"[{title}]\n"
        found = text.find(mark, at)
        if not title or found < 0:
            return []
        starts.append((found, title))
        at = found + len(mark)
    return [(title, text[start:(starts[i + 1][0] if i + 1 < len(starts) else len(text))])
            for i, (start, title) in enumerate(starts)]


def _tool(service: Service, m: ChatMessage, text: str, arguments: str
          ) -> LabelledSource | None:
    outcome = m.attributes.get(attr.OUTCOME)
    if outcome is not None and outcome not in TOOL_TEXTS:
        return None
    name = m.attributes.get(attr.TOOL_NAME)
    name = name if isinstance(name, str) else ""
    tool = service.tool(name) if name else None
    spec = tool.spec if tool is not None else None
    mcp = spec is not None and (spec.summary or "").startswith("mcp ")
    trusted = spec is not None and spec.trusted_results
    return LabelledSource(kind="mcp" if mcp else "tool", trusted=trusted, text=_text(text),
                          tool_name=name, tool_call_id=m.tool_call_id or "",
                          echoes=echoes_of(parsed_arguments(arguments)))


def _vouched(service: Service, m: ChatMessage, text: str) -> LabelledSource | None:
    """The whole values the tool vouches for in this result (None: none)."""
    name = m.attributes.get(attr.TOOL_NAME)
    tool = service.tool(name) if isinstance(name, str) and name else None
    keys = tool.spec.trusted_values if tool is not None else False
    if not keys or m.attributes.get(attr.OUTCOME) != CallStatus.COMPLETED.value:
        return None
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None  # not JSON: no fields to read, nothing vouched
    values = whole_values(parsed, None if keys is True else frozenset(keys))
    if not values:
        return None
    return LabelledSource(kind="value", trusted=True, text="", tool_name=str(name),
                          tool_call_id=m.tool_call_id or "", values=tuple(values))


def whole_values(value: Any, keys: frozenset[str] | None) -> list[tuple[str, str | int | float]]:
    """The strings and numbers of a parsed result, each with the key it sat
    under ("" in a list at the top): all of them (`keys` None), or those
    under one of `keys` at any depth. Depth-first, in order, bounded."""
    out: list[tuple[str, str | int | float]] = []
    # (value, its nearest key, whether a named key is above it, depth)
    stack: list[tuple[Any, str, bool, int]] = [(value, "", keys is None, 0)]
    while stack and len(out) < MAX_VALUES:
        v, key, taken, depth = stack.pop()
        if isinstance(v, dict):
            if depth < MAX_DEPTH:
                stack.extend((item, str(k), taken or (keys is not None and k in keys),
                              depth + 1) for k, item in reversed(list(v.items())))
        elif isinstance(v, list):
            if depth < MAX_DEPTH:
                stack.extend((item, key, taken, depth + 1) for item in reversed(v))
        elif taken and isinstance(v, str | int | float) and not isinstance(v, bool):
            out.append((key, v))
    return out


def _approved(m: ChatMessage, calls: dict[str, ToolCall],
              approved: Collection[tuple[str, str]]) -> LabelledSource | None:
    """The arguments a person approved, as the tool ran with them (None: the
    call was not approved by a person, or its arguments are not known)."""
    wf = m.attributes.get(attr.WORKFLOW_ID)
    call = calls.get(m.tool_call_id or "")
    if call is None or not isinstance(wf, str) or (wf, call.id) not in approved:
        return None
    edited = m.attributes.get(attr.EDITED)
    if isinstance(edited, dict):  # approved with edits: what the reviewer sent
        arguments = edited.get("arguments")
    else:
        arguments = parsed_arguments(call.arguments or "{}")
    if not isinstance(arguments, dict):
        return None
    values = [(str(name), v) for name, arg in arguments.items()
              for _, v in whole_values(arg, None)][:MAX_VALUES]
    if not values:
        return None
    return LabelledSource(kind="approval", trusted=True, text="", tool_name=call.name,
                          tool_call_id=call.id, values=tuple(values))


def _text(content: Any) -> str:
    """A result's text; JSON is read so escapes (\\u0040) are the characters they stand for."""
    if not isinstance(content, str):
        return ""
    try:
        parsed = json.loads(content)
    except (ValueError, RecursionError):
        return content
    if isinstance(parsed, str):
        return parsed
    return content if not isinstance(parsed, dict | list) else _joined(parsed, content)


def _joined(value: Any, fallback: str) -> str:
    """A JSON result's keys, strings and numbers, each on its own line (so a
    value at the end of one field and the start of the next are not glued).
    Keys are text the model reads too: `{"shared_with": {"eve@evil.example":
    "rw"}}` holds an address."""
    out: list[str] = []
    stack = [value]
    while stack and len(out) < 100_000:
        v = stack.pop()
        if isinstance(v, dict):
            for k, item in reversed(list(v.items())):
                stack.extend((item, str(k)))
        elif isinstance(v, list):
            stack.extend(reversed(v))
        elif isinstance(v, str | int | float) and not isinstance(v, bool):
            out.append(str(v))
    return "\n".join(out) or fallback
