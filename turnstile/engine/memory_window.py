"""What of a conversation is sent to the model: the memory window and the
tool-result cap (pure; stored memory always stays whole).

The window is policy as data (`MemoryWindow`, a field of the service spec that
`begin_turn` records in history). The rules, in order:

- a tool call's arguments longer than the window's result cap are sent as
  a note of their size (valid JSON);
- a tool result longer than its tool's cap (and than a quarter of the token
  window) is cut, with a visible marker that
  says how much was left out and how to get more (the full result stays in
  memory and in the call ledger);
- the system message always stays, and so do the newest user message and
  the newest message group (what the model must answer);
- then the newest groups are kept while they fit, by message count and by
  tokens; the oldest go first, and everything older than the first group that
  does not fit goes too (the window is one contiguous tail, never a sample);
- an assistant message with tool calls and the results of those calls are
  one group: they stay or leave together, so neither a call without its
  result nor a result without its call is ever sent.

Token counts come from a counting function the caller passes (tiktoken for
OpenAI model names, an estimate otherwise: `turnstile.providers.tokens`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from turnstile.engine import attributes as attr
from turnstile.engine.messages import ChatMessage

DEFAULT_TOOL_RESULT_MAX_BYTES = 16 * 1024
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators of one chat message (OpenAI's count)
IMAGE_TOKENS = 765  # an image part: OpenAI's cost of a 512x512 high-detail image

CountTokens = Callable[[str], int]


class MemoryWindow(BaseModel):
    """Per service: how much of the stored conversation each model request carries.

    `max_tokens=None` in a `Service` means "sized for the configured model":
    the worker fills it in from the model's context size (see README) before
    the spec reaches the workflow, so the spec in history always has a number.
    """

    max_messages: int | None = Field(default=None, ge=1)  # besides the system message
    max_tokens: int | None = Field(default=None, ge=1)  # messages, tools and format included
    tool_result_max_bytes: int = Field(default=DEFAULT_TOOL_RESULT_MAX_BYTES, ge=256)


RESULT_SHARE = 4  # one tool result takes at most 1/RESULT_SHARE of the token window
BYTES_PER_TOKEN_FLOOR = 3  # bytes a token is assumed to hold when sizing that share
MIN_RESULT_BYTES = 1024


def result_cap(tool_cap: int, window: MemoryWindow) -> int:
    """Bytes of one tool result sent: the tool's cap, and never more than a
    quarter of the token window (so a round of a few large results still
    fits a small model's context)."""
    if window.max_tokens is None:
        return tool_cap
    share = window.max_tokens * BYTES_PER_TOKEN_FLOOR // RESULT_SHARE
    return max(MIN_RESULT_BYTES, min(tool_cap, share))


def truncation_marker(omitted_bytes: int, total_bytes: int, tool_name: str) -> str:
    return (f"\n[… {omitted_bytes:,} of {total_bytes:,} bytes of this {tool_name or 'tool'} "
            "result were left out to fit the model's context; the full result is stored. "
            "To see more, call the tool again with narrower arguments (a filter, a smaller "
            "range or fewer rows).]")


def cap_text(text: str, max_bytes: int, tool_name: str = "") -> str:
    """`text` if it fits in `max_bytes` of UTF-8, else its head with a marker;
    the result (marker included) never exceeds `max_bytes`."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    # The marker's length depends on the numbers in it; size it with the largest.
    room = max(0, max_bytes - len(truncation_marker(len(data), len(data), tool_name).encode()))
    head = data[:room].decode("utf-8", errors="ignore")  # never half a character
    return head + truncation_marker(len(data) - len(head.encode("utf-8")), len(data), tool_name)


def cap_tool_results(messages: Sequence[ChatMessage],
                     cap_for: Callable[[str], int]) -> list[ChatMessage]:
    """Tool results capped per tool (`cap_for(tool_name)` bytes); others unchanged.
    The tool's name is the `turnstile.tool_name` attribute of its result."""
    out = []
    for m in messages:
        if m.role == "tool" and m.content:
            name = str(m.attributes.get(attr.TOOL_NAME) or "")
            capped = cap_text(m.content, cap_for(name), name)
            if capped is not m.content:
                m = m.model_copy(update={"content": capped})
        out.append(m)
    return out


def cut_arguments(arguments: str, max_bytes: int) -> str:
    """A call's arguments as sent: whole when they fit in `max_bytes`, else a
    JSON object saying what was left out (still valid JSON, so the request is
    one the endpoint accepts; the call ran with them in full, and memory and
    the ledger keep them)."""
    size = len(arguments.encode("utf-8"))
    if size <= max_bytes:
        return arguments
    return json.dumps({"_cut": f"{size:,} bytes of arguments were left out of this request "
                               "to fit the model's context; the call ran with them in full"})


def cap_tool_arguments(messages: Sequence[ChatMessage], max_bytes: int) -> list[ChatMessage]:
    """Tool-call arguments over `max_bytes` cut (cut_arguments); the rest unchanged."""
    out = []
    for m in messages:
        if m.role == "assistant" and any(len(c.arguments) > max_bytes // 4
                                         for c in m.tool_calls):
            calls = [c.model_copy(update={"arguments": cut_arguments(c.arguments, max_bytes)})
                     for c in m.tool_calls]
            m = m.model_copy(update={"tool_calls": calls})
        out.append(m)
    return out


UNANSWERED_RESULT = (
    "No result was recorded for this call: its turn ended (terminated, reset or lost) "
    "before the call finished. It may or may not have taken effect; check before "
    "calling it again."
)


def paired(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """What endpoints require of a request: every tool call answered by a tool
    message right after its assistant message, every tool message answering
    one. A call memory holds no result for (its turn was terminated
    mid-call) is sent with an `is_error` result saying so; a result whose call
    is not there is left out. Memory itself is not changed."""
    out: list[ChatMessage] = []
    open_calls: dict[str, str] = {}  # id -> tool name, in call order

    def close() -> None:
        for call_id, name in open_calls.items():
            out.append(ChatMessage(role="tool", tool_call_id=call_id, is_error=True,
                                   content=UNANSWERED_RESULT,
                                   attributes={attr.TOOL_NAME: name}))
        open_calls.clear()

    for m in messages:
        if m.role == "tool":
            if m.tool_call_id in open_calls:
                del open_calls[m.tool_call_id]
                out.append(m)
            continue
        close()
        out.append(m)
        if m.role == "assistant":
            open_calls.update((c.id, c.name) for c in m.tool_calls)
    close()
    return out


def message_tokens(m: ChatMessage, count: CountTokens) -> int:
    n = MESSAGE_OVERHEAD_TOKENS + count(m.content or "")
    for c in m.tool_calls:
        n += MESSAGE_OVERHEAD_TOKENS + count(c.name) + count(c.arguments)
    return n + IMAGE_TOKENS * len(m.parts)


def json_tokens(value: object, count: CountTokens) -> int:
    """Tokens of what else a request carries (tool schemas, response format)."""
    return count(json.dumps(value, separators=(",", ":"))) if value else 0


@dataclass(frozen=True)
class Windowed:
    messages: list[ChatMessage]
    dropped: int  # stored messages left out of this request
    tokens: int  # counted tokens of the messages sent


def _groups(messages: Sequence[ChatMessage]) -> list[list[int]]:
    """Indices grouped: an assistant message with tool calls and the results
    of its calls form one group; every other message is its own."""
    groups: list[list[int]] = []
    owner: dict[str, int] = {}  # tool call id -> its group
    for i, m in enumerate(messages):
        if m.role == "tool" and m.tool_call_id in owner:
            groups[owner[m.tool_call_id]].append(i)
            continue
        groups.append([i])
        if m.role == "assistant":
            for c in m.tool_calls:
                owner[c.id] = len(groups) - 1
    return groups


def apply_window(messages: Sequence[ChatMessage], window: MemoryWindow, count: CountTokens,
                 reserved_tokens: int = 0) -> Windowed:
    """The messages to send: see the module docstring for the rules.
    `reserved_tokens` are taken by the rest of the request (tools, format)."""
    groups = _groups(messages)
    pinned = {g for g, idx in enumerate(groups) if messages[idx[0]].role == "system"}
    if groups:
        pinned.add(len(groups) - 1)
    last_user = max((g for g, idx in enumerate(groups) if messages[idx[0]].role == "user"),
                    default=None)
    if last_user is not None:
        pinned.add(last_user)
    tokens: dict[int, int] = {}  # counted lazily: a long history is mostly never visited

    def count_of(i: int) -> int:
        if i not in tokens:
            tokens[i] = message_tokens(messages[i], count)
        return tokens[i]

    def size(g: int) -> tuple[int, int]:
        idx = groups[g]
        counted = sum(1 for i in idx if messages[i].role != "system")
        return counted, sum(count_of(i) for i in idx)

    used_msgs = sum(size(g)[0] for g in pinned)
    used_tokens = reserved_tokens + sum(size(g)[1] for g in pinned)
    keep = set(pinned)
    for g in range(len(groups) - 1, -1, -1):
        if g in keep:
            continue
        n, t = size(g)
        if ((window.max_messages is not None and used_msgs + n > window.max_messages)
                or (window.max_tokens is not None and used_tokens + t > window.max_tokens)):
            break
        keep.add(g)
        used_msgs += n
        used_tokens += t
    chosen = sorted(i for g in keep for i in groups[g])
    return Windowed(messages=[messages[i] for i in chosen],
                    dropped=len(messages) - len(chosen),
                    tokens=sum(count_of(i) for i in chosen))
