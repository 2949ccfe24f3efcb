"""The model call: one activity per model request."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnstile.activities.model_refusals import RefusalCount
from turnstile.activities.model_request import (
    RequestShape,
    build_request,
    read_constrained_reply,
    read_text_calls,
    read_window,
)
from turnstile.activities.model_stream import request_model
from turnstile.activities.run_writes import as_current_run
from turnstile.activities.runtime import (
    Activities,
    application_error,
    model_name,
    turn_workflow_id,
    with_heartbeat,
)
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import CALL_MODEL, ModelCallInput, ModelCallResult
from turnstile.engine.errors import (
    BudgetExceeded,
    ConfigurationError,
    DatabaseUnavailable,
    MalformedModelResponse,
    MemoryConflictError,
    MessageTooLong,
    ModelRequestRejected,
    ResetConflict,
    RunSuperseded,
)
from turnstile.engine.messages import ChatMessage
from turnstile.engine.specs import ToolSpec
from turnstile.providers import ModelRequest, ModelResponse
from turnstile.providers.openai_compat import InvalidRequestAnswer, RetryableModelError
from turnstile.runtime.services import Service
from turnstile.runtime.tracing import model_span, record_model_response
from turnstile.stores import runs, usage
from turnstile.stores.connection import Connection
from turnstile.stores.superseded import call_identity, prior_calls

log = logging.getLogger("turnstile.activities")
T = TypeVar("T")


def model_metrics(service: str, model: str, seconds: float, tokens_in: int,
                  tokens_out: int) -> None:
    """Model-call latency and tokens, on the worker's Prometheus endpoint
    (Temporal's activity meter: a no-op when TURNSTILE_METRICS_PORT is unset)."""
    meter = activity.metric_meter()
    attrs = {"service": service[:64], "model": model[:64]}
    meter.create_histogram_timedelta("turnstile_model_call_latency",
                                     "one model request, sent to answered").record(
        timedelta(seconds=seconds), attrs)
    tokens = meter.create_counter("turnstile_tokens", "tokens by direction, model and service")
    tokens.add(max(0, int(tokens_in)), {**attrs, "direction": "in"})
    tokens.add(max(0, int(tokens_out)), {**attrs, "direction": "out"})


class ModelActivities(Activities):
    @activity.defn(name=CALL_MODEL)
    async def call_model(self, req: ModelCallInput) -> ModelCallResult:
        # Heartbeating while the model answers (streamed or not): a worker lost
        # mid-request costs the heartbeat timeout, not the request's timeout.
        # On shutdown the request is handed back: asking again is safe. The
        # heartbeats carry the count of identical "invalid request" answers
        # (activities/model_refusals.py).
        refusals = RefusalCount()
        return await with_heartbeat(self._call_model(req, refusals), hand_back=True,
                                    details=refusals.beat)

    def _store(self, req: ModelCallInput, seq: int, messages: list[ChatMessage],
               horizon: int | None, w: runs.Writer | None,
               conn: Connection | None = None) -> None:
        """Memory writes of this run (turnstile.stores.runs), in `conn`'s
        transaction or one of their own: a reset run's first one supersedes
        what the run it replaced wrote from `horizon` on."""
        if w is not None:
            runs.write(self.rt.db, req.conversation_id, seq, messages, w, horizon, conn)
        elif messages:
            with self.rt.db.joined(conn) as tx:
                self.rt.memory.append_in(tx, req.conversation_id, seq, messages,
                                         turn_workflow_id())

    async def _as_run(self, req: ModelCallInput, work: Callable[[runs.Writer | None], T]) -> T:
        """`work` in one thread hop, as this activity's run when the turn has
        an execution chain (activities.run_writes); memory refusals fail the call
        for good, an unreachable database is retried."""
        try:
            if req.execution_chain:
                return await as_current_run(self.rt.db, req.execution_chain, work)
            return await self.rt.db.call(work, None)
        except (MemoryConflictError, ResetConflict, RunSuperseded, MessageTooLong) as exc:
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc

    def _prepare(self, req: ModelCallInput, service: Service, tools: list[ToolSpec],
                 w: runs.Writer | None) -> tuple[ChatMessage | None, ModelRequest | None]:
        """Before the request (one thread hop): what the workflow wrote since
        the last request (step 10's system and user messages, a re-ask) goes
        into memory, and nothing an earlier run of this turn wrote from here
        on is read. Then either this run's stored response (a retry after the
        response was stored: the worker was lost before completing) or the
        request built from memory. One transaction: the write, then the reads.

        With a daily token budget (TURNSTILE_DAILY_TOKEN_BUDGET), a user at or
        over it gets BudgetExceeded instead of a request, once the write is
        committed: the turn's messages stay in memory, as for any turn that
        ends before its model call."""
        first = req.prelude_seq if req.prelude else req.response_seq
        wf_id, memory = turn_workflow_id(), self.rt.memory
        run_id = activity.info().workflow_run_id
        shape = RequestShape(self.rt, service, req, tools)
        shape.refuse_too_long(req.prelude)  # before anything is stored
        budget = self.rt.settings.daily_token_budget
        spent: int | None = None
        with self.rt.db.connect() as conn:
            self._store(req, first, req.prelude, first, w, conn)
            stored = memory.get(req.conversation_id, req.response_seq, conn)
            if stored is not None and stored[1] == wf_id and stored[0].role == "assistant" and (
                    stored[2] in (None, run_id)):
                return stored[0], None  # asked and answered already: nothing more to spend
            if budget is not None and req.user_id:
                spent = usage.tokens_since(conn, req.user_id, usage.utc_midnight())
            messages = read_window(self.rt, shape, wf_id, conn)
        if spent is not None and budget is not None and spent >= budget:
            raise BudgetExceeded.spent(req.user_id, spent, budget)
        request, _ = build_request(shape, messages)
        return None, request

    def _keep(self, req: ModelCallInput, message: ChatMessage, numbered: list[bool],
              spent: usage.ModelCall, w: runs.Writer | None) -> None:
        """After the response (one thread hop): its calls get ids of their own
        (read in the write's transaction: one transaction, not two), then it
        is stored at the slot the workflow assigned, with what the call cost
        (turnstile.stores.usage) in the same transaction: a retried attempt
        finds both or neither, and never counts the call twice."""
        with self.rt.db.connect() as conn:
            if not numbered:  # once, even when the write runs again confirmed
                self._number_calls(req, message, turn_workflow_id(), conn)
                numbered.append(True)
            self._store(req, req.response_seq, [message], None, w, conn)
            usage.record(conn, spent)

    def _usage(self, req: ModelCallInput, response: ModelResponse) -> usage.ModelCall:
        """What this call cost, as `model_usage` keeps it."""
        return usage.ModelCall(
            workflow_id=turn_workflow_id(), run_id=activity.info().workflow_run_id or "",
            call_seq=req.response_seq, conversation_id=req.conversation_id,
            user_id=req.user_id, service=req.service,
            model=(response.model or model_name(self.rt, req.service)
                   or self.rt.provider_for(req.service).name),
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens)

    async def _call_model(self, req: ModelCallInput, refusals: RefusalCount) -> ModelCallResult:
        wf_id = turn_workflow_id()
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
        provider = self.rt.provider_for(req.service)
        try:
            stored, request = await self._as_run(
                req, lambda w: self._prepare(req, service, tools, w))
        except ModelRequestRejected as exc:
            raise application_error(exc, non_retryable=True) from exc
        except BudgetExceeded as exc:  # not retried: the turn ends refused
            log.info("model call of %s refused: %s", wf_id, exc)
            raise application_error(exc, non_retryable=True) from exc
        if stored is not None:
            return ModelCallResult(message=stored, provider=provider.name)
        assert request is not None
        try:
            with model_span(provider.name, getattr(provider, "model", None), req.round) as span:
                began = time.monotonic()
                response = await request_model(self.rt, provider, req, request, wf_id)
                model_metrics(req.service, response.model or provider.name,
                              time.monotonic() - began, response.usage.prompt_tokens,
                              response.usage.completion_tokens)
                record_model_response(
                    span, model=response.model, input_tokens=response.usage.prompt_tokens,
                    output_tokens=response.usage.completion_tokens,
                    finish_reason=response.finish_reason,
                    tool_calls=len(response.message.tool_calls))
        except InvalidRequestAnswer as exc:
            raise refusals.refused(exc) from exc
        except RetryableModelError as exc:
            refusals.other_failure()
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
        elif (req.model or service.model).constrain_tool_calls and tools:
            read_constrained_reply(message)
        elif (req.model or service.model).text_tool_calls:
            read_text_calls(message, [t.name for t in tools])
        message.attributes[attr.WORKFLOW_ID] = wf_id
        numbered: list[bool] = []
        spent = self._usage(req, response)
        await self._as_run(req, lambda w: self._keep(req, message, numbered, spent, w))
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
            provider=provider.name,
            tools=policies,
        )

    def _number_calls(self, req: ModelCallInput, message: ChatMessage, wf_id: str,
                      conn: Connection) -> None:
        """A result is matched to its call by id, and a call's effects are keyed
        by it: a call without one, with a "/" in it, reusing one of this turn, or reusing the id
        of a superseded call of this turn that was a different call (another
        tool or other arguments: it must not get that call's result) gets a
        fresh id that is stable for this response. The same call under the
        same id keeps it: the ledger's stored result is reused, not repeated."""
        if not message.tool_calls:
            return
        prior = prior_calls(self.rt.db, req.conversation_id, wf_id, req.execution_chain,
                            conn) if req.execution_chain else {}
        taken = set(req.taken_call_ids)
        for i, call in enumerate(message.tool_calls):
            me = call_identity(call.name, call.arguments) if prior else ""
            # "/" is ours: the audit keys a refused decision "<call id>/refused-<n>",
            # so a model-chosen id never holds one (it could name such a row).
            if (not call.id or "/" in call.id or call.id in taken
                    or prior.get(call.id, me) != me):
                base = (call.id or "call").replace("/", "-")
                fresh, n = f"{base}~{req.response_seq}.{i}", 1
                while fresh in taken or prior.get(fresh, me) != me:
                    n += 1
                    fresh = f"{base}~{req.response_seq}.{i}.{n}"
                call.id = fresh
            taken.add(call.id)
