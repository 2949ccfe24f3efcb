"""Every activity's log lines name the conversation and the tool call it
works for (JSON logs: turnstile.runtime.log_masking), read from its input:
the request models of turnstile.engine.activity_io carry `conversation_id`,
and a tool's carry the call."""

from __future__ import annotations

from typing import Any

from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from turnstile.runtime.log_masking import log_fields


def fields_of(args: Any) -> dict[str, str | None]:
    request = args[0] if args else None
    conversation = getattr(request, "conversation_id", None)
    call = getattr(request, "call", None)
    call_id = getattr(call, "id", None) or getattr(request, "tool_call_id", None)
    return {"conversation_id": conversation if isinstance(conversation, str) else None,
            "tool_call_id": call_id if isinstance(call_id, str) else None}


class LogContext(Interceptor):
    """Registered on every Turnstile worker (worker.build_worker)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        with log_fields(**fields_of(input.args)):
            return await super().execute_activity(input)
