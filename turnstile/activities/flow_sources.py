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
  not sources: they may echo the model's own arguments back.

The model's own messages are never sources. At most the newest
`MAX_MESSAGES` messages are read.
"""

from __future__ import annotations

import json
from typing import Any

from turnstile.engine import attributes as attr
from turnstile.engine.contract import CallStatus
from turnstile.engine.messages import ChatMessage
from turnstile.engine.provenance import LabelledSource, echoes_of
from turnstile.runtime.services import Service

MAX_MESSAGES = 400
# Outcomes of a call whose message holds what the tool returned (or raised).
TOOL_TEXTS = frozenset({CallStatus.COMPLETED.value, CallStatus.FAILED.value,
                        CallStatus.INTERRUPTED.value})


def labelled(service: Service, messages: list[ChatMessage]) -> list[LabelledSource]:
    sources: list[LabelledSource] = []
    if service.system_prompt:
        sources.append(LabelledSource(kind="system", trusted=True, text=service.system_prompt))
    asked: dict[str, str] = {}  # call id -> its arguments, from the latest assistant message
    for m in messages:
        text = m.content or ""
        if m.role == "assistant":
            asked.update((c.id, c.arguments) for c in m.tool_calls)
        elif m.role == "system":
            sources.append(LabelledSource(kind="system", trusted=True, text=text))
        elif m.role == "user":
            sources.extend(_user(m, text))
        elif m.role == "tool":
            source = _tool(service, m, text, asked.get(m.tool_call_id or "", "{}"))
            if source is not None:
                sources.append(source)
    return sources


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
                          echoes=echoes_of(_parsed(arguments)))


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return {}


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
    """A JSON result's strings and numbers, each on its own line (so a value
    at the end of one field and the start of the next are not glued)."""
    out: list[str] = []
    stack = [value]
    while stack and len(out) < 100_000:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, list):
            stack.extend(reversed(v))
        elif isinstance(v, str | int | float) and not isinstance(v, bool):
            out.append(str(v))
    return "\n".join(out) or fallback
