"""What one model request carries: the stored conversation through the
service's memory window, tool results capped per tool, and (after an answer
cut at the length limit) the continuation prompt. Memory itself is never
changed here: the window and the caps apply to what is sent."""

from __future__ import annotations

import logging

from activities.runtime import Runtime, model_name
from turnstile.engine.activity_io import ModelCallInput
from turnstile.engine.endings import CONTINUATION_PROMPT
from turnstile.engine.memory_window import (
    MemoryWindow,
    Windowed,
    apply_window,
    cap_tool_results,
    json_tokens,
    paired,
    result_cap,
)
from turnstile.engine.messages import ChatMessage
from turnstile.engine.specs import ToolSpec
from turnstile.providers import ModelRequest
from turnstile.providers.tokens import context_tokens, counter_for, window_tokens
from turnstile.runtime.services import Service

log = logging.getLogger(__name__)


def current_window(rt: Runtime, service: Service) -> MemoryWindow:
    """The worker's window for a service (turns whose input carries none)."""
    return service.spec(model_window_tokens=window_tokens(
        context_tokens(model_name(rt), rt.settings.context_tokens))).memory


def build_request(rt: Runtime, service: Service, req: ModelCallInput,
                  stored: list[ChatMessage],
                  tools: list[ToolSpec]) -> tuple[ModelRequest, Windowed]:
    window = req.window or current_window(rt, service)

    def cap_for(tool_name: str) -> int:
        t = service.tool(tool_name)
        if t is not None and t.spec.max_result_bytes is not None:
            return result_cap(t.spec.max_result_bytes, window)
        return result_cap(window.tool_result_max_bytes, window)

    messages = cap_tool_results(paired(stored), cap_for)
    if req.continuation:
        messages.append(ChatMessage(role="user", content=CONTINUATION_PROMPT))
    count = counter_for(model_name(rt))
    reserved = (json_tokens([t.openai_schema() for t in tools], count)
                + json_tokens(req.response_format, count))
    sent = apply_window(messages, window, count, reserved)
    if sent.dropped:
        log.info("conversation %s: %d of %d stored messages sent (%d tokens; window %s)",
                 req.conversation_id, len(sent.messages), len(messages), sent.tokens,
                 window.model_dump(exclude_none=True))
    return ModelRequest(messages=sent.messages, tools=tools,
                        response_format=req.response_format), sent
