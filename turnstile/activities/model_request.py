"""What one model request carries: the stored conversation through the
service's memory window, tool results capped per tool, and (after an answer
cut at the length limit) the continuation prompt. Memory itself is never
changed here: the window and the caps apply to what is sent."""

from __future__ import annotations

import copy
import logging
from typing import Any

from turnstile.activities.runtime import Runtime, model_name
from turnstile.engine import answer_rules, constrained_calls
from turnstile.engine.activity_io import ModelCallInput
from turnstile.engine.endings import CONTINUATION_PROMPT
from turnstile.engine.errors import MessageTooLong
from turnstile.engine.memory_window import (
    CountTokens,
    MemoryWindow,
    Windowed,
    apply_window,
    cap_tool_arguments,
    cap_tool_results,
    json_tokens,
    message_tokens,
    paired,
    result_cap,
)
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.engine.specs import ToolSpec
from turnstile.providers import ModelRequest
from turnstile.providers.tokens import context_tokens, counter_for, window_tokens
from turnstile.runtime.services import Service
from turnstile.stores.connection import Connection

log = logging.getLogger(__name__)


def current_window(rt: Runtime, service: Service) -> MemoryWindow:
    """The worker's window for a service (turns whose input carries none)."""
    return service.spec(model_window_tokens=window_tokens(
        context_tokens(model_name(rt), rt.settings.context_tokens))).memory


# The tokens a request's tool schemas take, counted once per list of specs
# and model (their JSON was ~0.2 ms per sales request): kept while every spec
# still reads the same (name, description, parameters equal to a copy taken
# when counted), as turnstile.providers.wire_tools keeps their rendering; at
# most TOOL_TOKENS_KEPT lists (the oldest go first).
TOOL_TOKENS_KEPT = 256
_ToolsRead = list[tuple[str, str, dict[str, Any]]]
_tool_tokens: dict[tuple[str | None, tuple[int, ...]], tuple[_ToolsRead, int]] = {}


def tool_tokens(model: str | None, tools: list[ToolSpec], count: CountTokens) -> int:
    """`json_tokens` of the tools' schemas, counted once while they are unchanged."""
    key = (model, tuple(id(t) for t in tools))
    kept = _tool_tokens.get(key)
    if kept is not None and kept[0] == [(t.name, t.description, t.parameters) for t in tools]:
        return kept[1]
    n = json_tokens([t.openai_schema() for t in tools], count)
    _tool_tokens.pop(key, None)
    while len(_tool_tokens) >= TOOL_TOKENS_KEPT:
        del _tool_tokens[next(iter(_tool_tokens))]
    _tool_tokens[key] = ([(t.name, t.description, copy.deepcopy(t.parameters))
                          for t in tools], n)
    return n


class RequestShape:
    """How one request is cut from stored messages: the window, the caps, the
    tokens the tools and the response format take."""

    def __init__(self, rt: Runtime, service: Service, req: ModelCallInput,
                 tools: list[ToolSpec]) -> None:
        self.req = req
        self.window = req.window or current_window(rt, service)
        self.model = model_name(rt)
        self.context = context_tokens(self.model, rt.settings.context_tokens)
        self.count = counter_for(self.model)
        self.reserved = (tool_tokens(self.model, tools, self.count)
                         + json_tokens(req.response_format, self.count))
        self.service, self.tools = service, tools

    def _cap_for(self, tool_name: str) -> int:
        t = self.service.tool(tool_name)
        if t is not None and t.spec.max_result_bytes is not None:
            return result_cap(t.spec.max_result_bytes, self.window)
        return result_cap(self.window.tool_result_max_bytes, self.window)

    def refuse_too_long(self, prelude: list[ChatMessage]) -> None:
        """MessageTooLong when the user message about to be stored cannot fit
        the model's context whatever the window leaves out (the window always
        keeps it: memory_window)."""
        for m in prelude:
            if m.role != "user":
                continue
            need = message_tokens(m, self.count) + self.reserved
            if need > self.context:
                raise MessageTooLong(
                    f"the message takes about {need:,} tokens with this service's tools; "
                    f"the model ({self.model or 'unnamed'}) reads at most {self.context:,} "
                    "(TURNSTILE_CONTEXT_TOKENS): shorten it or split it into turns")

    @property
    def bounded(self) -> bool:
        return self.window.max_messages is not None or self.window.max_tokens is not None

    def cut(self, stored: list[ChatMessage]) -> tuple[list[ChatMessage], Windowed]:
        messages = cap_tool_arguments(
            cap_tool_results(paired(stored), self._cap_for),
            result_cap(self.window.tool_result_max_bytes, self.window))
        if self.req.continuation:
            messages.append(ChatMessage(role="user", content=self.req.nudge or CONTINUATION_PROMPT))
        return messages, apply_window(messages, self.window, self.count, self.reserved)

    def full(self, stored: list[ChatMessage]) -> bool:
        """The window is full before the oldest of `stored` (MemoryStore.tail)."""
        return self.cut(stored)[1].dropped > 0


def read_window(rt: Runtime, shape: RequestShape, wf_id: str,
                conn: Connection) -> list[ChatMessage]:
    """The stored messages the request's window can reach: O(window) rows when
    the window is bounded (MemoryStore.tail), else the whole conversation."""
    conv = shape.req.conversation_id
    if not shape.bounded:
        return rt.memory.messages(conv, wf_id, conn)
    return rt.memory.tail(conv, wf_id, shape.full, conn)


def build_request(shape: RequestShape,
                  stored: list[ChatMessage]) -> tuple[ModelRequest, Windowed]:
    """The request `shape` cuts from `stored` (the shape that read them: its
    token counts of the tools and the response format are made once)."""
    req, tools = shape.req, shape.tools
    messages, sent = shape.cut(stored)
    if sent.dropped:
        log.info("conversation %s: %d of %d stored messages sent (%d tokens; window %s)",
                 req.conversation_id, len(sent.messages), len(messages), sent.tokens,
                 shape.window.model_dump(exclude_none=True))
    settings = req.model or shape.service.model  # the spec's, from history
    return ModelRequest(messages=sent.messages, tools=tools,
                        response_format=req.response_format,
                        max_tokens=settings.max_tokens, temperature=settings.temperature,
                        tool_choice=settings.choice_for(req.round, [t.name for t in tools]),
                        schema_dialect=settings.schema_dialect,
                        tool_results=settings.tool_results,
                        constrain_tool_calls=settings.constrain_tool_calls,
                        parallel_tool_calls=settings.parallel_tool_calls), sent


def read_constrained_reply(message: ChatMessage) -> None:
    """`ModelSettings.constrain_tool_calls`: the reply `{"answer": ...}`
    becomes that answer, `{"tool_calls": [...]}` those calls (ids
    `constrained-call-<n>`; validated, reviewed and journaled like any call).
    Anything else stays text, for the loop's rules on text."""
    if message.tool_calls or not message.content:
        return
    read = constrained_calls.read_reply(message.content)
    if read is None:
        return
    answer, calls = read
    message.content = answer if answer is not None else ""
    message.tool_calls = [ToolCall(id=f"constrained-call-{i}", name=name, arguments=args)
                          for i, (name, args) in enumerate(calls)]


def read_text_calls(message: ChatMessage, offered: list[str]) -> None:
    """`ModelSettings.text_tool_calls`: an answer that is only tool calls
    written as text becomes those calls (ids `text-call-<n>`; the activity
    numbers them like any call), so they are validated, reviewed, journaled
    and answered like calls the server parsed. The text goes: it was the calls."""
    if message.tool_calls or not message.content:
        return
    calls = answer_rules.calls_written_as_text(message.content, offered)
    if not calls:
        return
    message.tool_calls = [ToolCall(id=f"text-call-{i}", name=name, arguments=args)
                          for i, (name, args) in enumerate(calls)]
    message.content = ""
    log.info("read %d tool call(s) the model wrote as text: %s", len(calls),
             ", ".join(name for name, _ in calls))
