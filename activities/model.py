"""The model call: one activity per model request."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.model_request import build_request
from activities.model_stream import request_model
from activities.runs import as_current_run
from activities.runtime import Runtime, application_error, turn_workflow_id, with_heartbeat
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import CALL_MODEL, ModelCallInput, ModelCallResult
from turnstile.engine.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    MalformedModelResponse,
    MemoryConflictError,
    ModelRequestRejected,
    ResetConflict,
    RunSuperseded,
)
from turnstile.engine.messages import ChatMessage
from turnstile.providers.openai_compat import RetryableModelError
from turnstile.runtime.tracing import model_span, record_model_response
from turnstile.stores import runs
from turnstile.stores.superseded import call_identity, prior_calls

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

    async def _write(self, req: ModelCallInput, seq: int, messages: list[ChatMessage],
                     horizon: int | None) -> None:
        """Memory writes of this run (turnstile.stores.runs): a reset run's
        first one supersedes what the run it replaced wrote from `horizon` on."""
        conv = req.conversation_id
        try:
            if req.execution_chain:
                await as_current_run(req.execution_chain, lambda w: runs.write(
                    self.rt.db, conv, seq, messages, w, horizon))
            elif messages:
                await asyncio.to_thread(self.rt.memory.append, conv, seq, messages,
                                        turn_workflow_id())
        except (MemoryConflictError, ResetConflict, RunSuperseded) as exc:
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc

    async def _call_model(self, req: ModelCallInput) -> ModelCallResult:
        wf_id = turn_workflow_id()
        memory = self.rt.memory
        # What the workflow wrote since the last request (step 10's system and
        # user messages, a re-ask) is in memory before the model is asked; and
        # nothing an earlier run of this turn wrote from here on is read.
        first = req.prelude_seq if req.prelude else req.response_seq
        await self._write(req, first, req.prelude, first)
        # A retry after the response was stored (worker lost before completing)
        # returns the stored response instead of asking the model again: only
        # this run's (a run that a reset replaced was superseded above).
        stored = await asyncio.to_thread(memory.get, req.conversation_id, req.response_seq)
        run_id = activity.info().workflow_run_id
        if stored is not None and stored[1] == wf_id and stored[0].role == "assistant" and (
                stored[2] in (None, run_id)):
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
        await asyncio.to_thread(self._number_calls, req, message, wf_id)
        message.attributes[attr.WORKFLOW_ID] = wf_id
        await self._write(req, req.response_seq, [message], None)
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

    def _number_calls(self, req: ModelCallInput, message: ChatMessage, wf_id: str) -> None:
        """A result is matched to its call by id, and a call's effects are keyed
        by it: a call without one, reusing one of this turn, or reusing the id
        of a superseded call of this turn that was a different call (another
        tool or other arguments: it must not get that call's result) gets a
        fresh id that is stable for this response. The same call under the
        same id keeps it: the ledger's stored result is reused, not repeated."""
        if not message.tool_calls:
            return
        prior = prior_calls(self.rt.db, req.conversation_id, wf_id, req.execution_chain) \
            if req.execution_chain else {}
        taken = set(req.taken_call_ids)
        for i, call in enumerate(message.tool_calls):
            me = call_identity(call.name, call.arguments) if prior else ""
            if not call.id or call.id in taken or prior.get(call.id, me) != me:
                fresh, n = f"{call.id or 'call'}~{req.response_seq}.{i}", 1
                while fresh in taken or prior.get(fresh, me) != me:
                    n += 1
                    fresh = f"{call.id or 'call'}~{req.response_seq}.{i}.{n}"
                call.id = fresh
            taken.add(call.id)
