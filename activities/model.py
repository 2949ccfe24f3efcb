"""The model call: one activity per model request."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.model_request import build_request
from activities.model_stream import request_model
from activities.runtime import Runtime, application_error, turn_workflow_id, with_heartbeat
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import CALL_MODEL, ModelCallInput, ModelCallResult
from turnstile.engine.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    MalformedModelResponse,
    MemoryConflictError,
    ModelRequestRejected,
)
from turnstile.providers.openai_compat import RetryableModelError
from turnstile.runtime.tracing import model_span, record_model_response

log = logging.getLogger("turnstile.activities")


class ModelActivities:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @activity.defn(name=CALL_MODEL)
    async def call_model(self, req: ModelCallInput) -> ModelCallResult:
        # Heartbeating while the model answers (streamed or not): a worker lost
        # mid-request costs the heartbeat timeout, not the request's timeout.
        # On shutdown the request is handed back: asking again is safe.
        return await with_heartbeat(self._call_model(req), hand_back=True)

    async def _call_model(self, req: ModelCallInput) -> ModelCallResult:
        wf_id = turn_workflow_id()
        memory = self.rt.memory
        if req.prelude:
            # What the workflow wrote since the last request (step 10's system
            # and user messages, a re-ask): in memory before the model is asked.
            try:
                await asyncio.to_thread(memory.append, req.conversation_id, req.prelude_seq,
                                        req.prelude, wf_id, req.execution_chain or None)
            except MemoryConflictError as exc:
                raise application_error(exc, non_retryable=True) from exc
            except DatabaseUnavailable as exc:
                raise application_error(exc, non_retryable=False) from exc
        # A retry after the response was stored (worker lost before completing)
        # returns the stored response instead of asking the model again.
        stored = await asyncio.to_thread(memory.get, req.conversation_id, req.response_seq)
        if stored is not None and stored[1] == wf_id and stored[0].role == "assistant":
            return ModelCallResult(message=stored[0], provider=self.rt.provider.name)
        service = self.rt.services.get(req.service)
        if any(service.tool(name) is None for name in req.tool_names):
            # Tools of an MCP server this worker has not listed yet (the turn's
            # resolve_tools ran on another worker): list them. One that cannot be
            # reached leaves its tools out of this request (resolve_tools reports it).
            try:
                await service.refresh_providers()
            except ConfigurationError as exc:  # resolve_tools fails the turn with it
                log.warning("tool providers of %s: %s", service.name, exc)
        tools = [t.spec for name in req.tool_names if (t := service.tool(name)) is not None]
        provider = self.rt.provider
        try:
            stored_messages = await asyncio.to_thread(memory.messages, req.conversation_id, wf_id)
            request, _ = await asyncio.to_thread(
                build_request, self.rt, service, req, stored_messages, tools)
            with model_span(provider.name, getattr(provider, "model", None), req.round) as span:
                response = await request_model(self.rt, req, request, wf_id)
                record_model_response(
                    span, model=response.model, input_tokens=response.usage.prompt_tokens,
                    output_tokens=response.usage.completion_tokens,
                    finish_reason=response.finish_reason,
                    tool_calls=len(response.message.tool_calls))
        except RetryableModelError as exc:
            delay = timedelta(seconds=exc.retry_after) if exc.retry_after is not None else None
            raise ApplicationError(
                str(exc), type=exc.error_type, next_retry_delay=delay
            ) from exc
        except (ModelRequestRejected, MalformedModelResponse) as exc:
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc
        message = response.message
        if req.continuation:
            message.tool_calls = []  # no tools were offered: a call here has no result slot
        # A result is matched to its call by id: a call without one, or reusing
        # one, gets a fresh id that is stable for this response.
        taken = set(req.taken_call_ids)
        for i, call in enumerate(message.tool_calls):
            if not call.id or call.id in taken:
                call.id = f"{call.id or 'call'}~{req.response_seq}.{i}"
            taken.add(call.id)
        message.attributes[attr.WORKFLOW_ID] = wf_id
        try:
            await asyncio.to_thread(
                memory.put, req.conversation_id, req.response_seq, message, wf_id,
                req.execution_chain or None)
        except MemoryConflictError as exc:
            raise application_error(exc, non_retryable=True) from exc
        known = set(req.known_policies)
        policies = []
        for call in message.tool_calls:
            found = service.tool(call.name)
            if found is not None and call.name not in known:
                policies.append(found.spec.policy())
                known.add(call.name)
        return ModelCallResult(
            message=message,
            usage=response.usage,
            finish_reason=response.finish_reason,
            model=response.model,
            provider=self.rt.provider.name,
            tools=policies,
        )
