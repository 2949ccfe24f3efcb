"""Activities of the pipeline's optional steps (docs/pipeline.md): they run
the service's components — transformer, retriever, guardrails, moderator,
return type — and publish the turn's events. The workflow schedules each only
when the service has the component.

A component that raises fails the attempt with a typed ApplicationError, so
Temporal retries it per the pipeline's retry policy (bounded); the workflow
then ends the turn with that type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnstile.activities.runtime import Activities, Runtime, application_error
from turnstile.engine import activity_io as io
from turnstile.engine.callables import invoke
from turnstile.engine.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    ModerationUnavailable,
    RetrievalError,
    SystemTransformerError,
    TurnstileError,
)
from turnstile.engine.events import TurnEventRecord
from turnstile.engine.output_format import parse_answer
from turnstile.engine.pipeline_spec import GuardrailVerdict
from turnstile.runtime.guardrails import (
    AttachmentInfo,
    Guardrail,
    GuardrailContext,
    GuardrailError,
    InputGuardrailContext,
    OutputGuardrailContext,
    run_chain,
)
from turnstile.runtime.moderation import ModerationContext, moderate
from turnstile.runtime.services import Service, SystemMessageContext
from turnstile.stores.retrieval_index import RetrievalContext, within_budget


def _component_error(kind: type[TurnstileError], exc: Exception) -> ApplicationError:
    """A service's component raised: a Turnstile error keeps its own type, any
    other exception is reported under the step's error type (`kind`)."""
    if isinstance(exc, TurnstileError):
        return application_error(exc, non_retryable=isinstance(exc, ConfigurationError))
    return ApplicationError(f"{kind.error_type} raised {type(exc).__name__}: {exc}",
                            type=kind.error_type)


async def deliver(rt: Runtime, events: list[TurnEventRecord]) -> None:
    """Turn events that ride with a bookkeeping activity (retrieve, release):
    to every listener, in a worker thread when a listener may block (one of
    an app's: turnstile.runtime.event_bus), at once when only the worker's
    own log line and span listen; a listener that fails is logged, never
    raised."""
    def publish_all() -> None:
        for event in events:
            rt.events.publish(event)

    if rt.events.may_block:
        await asyncio.to_thread(publish_all)
    else:
        publish_all()


async def retrieve_snippets(rt: Runtime, service: Service, req: io.RetrieveInput) -> io.Retrieved:
    """Step 5 on the worker: the service's retriever (raising what it raises),
    its best `top_k` snippets within `max_chars`."""
    if service.retriever is None:
        return io.Retrieved()
    ctx = RetrievalContext(db=rt.db, service=req.service,
                           conversation_id=req.conversation_id, user_id=req.user_id,
                           query=req.query, raw_message=req.raw_message, top_k=req.top_k)
    found = await invoke(service.retriever, ctx)
    snippets = [io.Snippet.model_validate(s) for s in list(found)[: req.top_k]]
    # The snippets enter the workflow's history: their size is the policy's, not the corpus's.
    return io.Retrieved(snippets=within_budget(snippets, req.max_chars))


class PipelineActivities(Activities):
    def _service(self, name: str) -> Service:
        return self.rt.services.get(name)

    @activity.defn(name=io.TRANSFORM_SYSTEM_MESSAGE)
    async def transform_system_message(self, req: io.TransformSystemInput
                                       ) -> io.TransformedSystem:
        service = self._service(req.service)
        if service.system_transformer is None:
            return io.TransformedSystem(system_message=req.system_message)
        ctx = SystemMessageContext(
            conversation_id=req.conversation_id, user_id=req.user_id, service=req.service,
            system_message=req.system_message, variables=req.variables,
            settings=self.rt.settings)
        try:
            text = await invoke(service.system_transformer, ctx)
        except Exception as exc:  # the service's callable: reported under its step's type
            raise _component_error(SystemTransformerError, exc) from exc
        if not isinstance(text, str):
            raise application_error(SystemTransformerError(
                f"system transformer returned {type(text).__name__}, not str"),
                non_retryable=True)
        return io.TransformedSystem(system_message=text)

    @activity.defn(name=io.RETRIEVE)
    async def retrieve(self, req: io.RetrieveInput) -> io.Retrieved:
        if req.events and activity.info().attempt == 1:
            await deliver(self.rt, req.events)  # step 4's "turn started", then step 5
        try:
            return await retrieve_snippets(self.rt, self._service(req.service), req)
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc
        except Exception as exc:  # the service's callable
            raise _component_error(RetrievalError, exc) from exc

    @activity.defn(name=io.INPUT_GUARDRAILS)
    async def input_guardrails(self, req: io.InputGuardrailsInput) -> GuardrailVerdict:
        return await _verdict(self._service(req.service).input_guardrails, InputGuardrailContext(
            conversation_id=req.conversation_id, user_id=req.user_id, service=req.service,
            message=req.message, raw_message=req.raw_message, variables=req.variables,
            attachments=[AttachmentInfo(type=a.type, mime_type=a.mime_type, url=a.url,
                                        chars=a.chars) for a in req.attachments]))

    @activity.defn(name=io.OUTPUT_GUARDRAILS)
    async def output_guardrails(self, req: io.OutputGuardrailsInput) -> GuardrailVerdict:
        ctx = OutputGuardrailContext(
            answer=req.answer, user_message=req.user_message, raw_message=req.raw_message,
            conversation_id=req.conversation_id, user_id=req.user_id, service=req.service,
            attempt=req.attempt)
        return await _verdict(self._service(req.service).output_guardrails, ctx)

    @activity.defn(name=io.MODERATE)
    async def moderate(self, req: io.ModerateInput) -> io.ModerationResult:
        service = self._service(req.service)
        if service.moderator is None:
            return io.ModerationResult(source="none")
        ctx = ModerationContext(conversation_id=req.conversation_id, user_id=req.user_id,
                                service=req.service, text=req.text,
                                raw_message=req.raw_message, settings=self.rt.settings)
        try:
            return await moderate(service.moderator, ctx)
        except ModerationUnavailable as exc:
            raise application_error(exc, non_retryable=not exc.retryable) from exc
        except Exception as exc:  # the service's callable
            raise _component_error(ModerationUnavailable, exc) from exc

    @activity.defn(name=io.PARSE_OUTPUT)
    def parse_output(self, req: io.ParseOutputInput) -> io.ParsedOutput:
        output_type = self._service(req.service).output_type
        if output_type is None:
            raise application_error(ConfigurationError(
                f"service {req.service!r} declares no output_type"), non_retryable=True)
        try:
            return io.ParsedOutput(ok=True, value=parse_answer(req.answer, output_type))
        except ValueError as exc:
            return io.ParsedOutput(ok=False, error=str(exc))

    @activity.defn(name=io.DISCARD_MESSAGE)
    async def discard_message(self, req: io.DiscardInput) -> None:
        try:
            await self.rt.db.call(self.rt.memory.discard, req.conversation_id, req.seq,
                                  req.reason)
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc

    @activity.defn(name=io.PUBLISH_EVENT)
    def publish_event(self, event: TurnEventRecord) -> list[str]:
        """Returns the errors of listeners that failed (logged, never raised)."""
        return self.rt.events.publish(event)


async def _verdict(chain: Sequence[Guardrail], ctx: GuardrailContext) -> GuardrailVerdict:
    """A guardrail chain's verdict; a guardrail that raised fails the attempt
    (retried)."""
    try:
        return await run_chain(chain, ctx)
    except GuardrailError as exc:
        raise application_error(exc, non_retryable=False) from exc
