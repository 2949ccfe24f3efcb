"""The pipeline's steps around the tool loop (docs/pipeline.md):
2, 3, 4-9, 11 and 15-17. `AgentTurn` calls them in the documented order.

Deterministic code only: each step decides from the service spec (recorded
in history by `begin_turn`) and schedules the activity that runs the
service's component. A service without the component schedules nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io, attributes as attr
    from turnstile.engine.contract import TurnInput, TurnResult, TurnStatus
    from turnstile.engine.errors import (
        InputGuardrailFailed,
        InputGuardrailFatal,
        ModerationFlagged,
        ModerationUnavailable,
        OutputGuardrailFailed,
        OutputGuardrailFatal,
        OutputGuardrailRetriesExhausted,
        OutputParseError,
        TurnstileError,
    )
    from turnstile.engine.events import TurnCompleted, TurnStarted
    from turnstile.engine.messages import ChatMessage
    from turnstile.engine.output_format import format_instructions, parse_reask
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.turn_rules import render_template
    from turnstile.engine.user_message import UserMessage, checked_attachments
    from turnstile.engine.versions import EVENTS_RIDE_ALONG
    from workflows.state import TurnState, TurnStopped, failure_reason
    from workflows.tool_options import event_options, pipeline_local_options, pipeline_options


@dataclass(frozen=True)
class Reask:
    """Ask the model again (steps 15/16): `retry` with the same messages
    (the refused answer is discarded), else with `text` as a new user message."""

    kind: Literal["retry", "reprompt", "parse"]
    text: str
    source: str  # recorded on the message (attribute turnstile.reprompt)


class PipelineSteps:
    def __init__(self, state: TurnState, turn: TurnInput, spec: ServiceSpec) -> None:
        self.s, self.turn, self.spec = state, turn, spec
        self.pipe = spec.pipeline
        self.policy = spec.pipeline.policy
        self.moderation: workflow.ActivityHandle[io.ModerationResult] | None = None
        self.started_at: datetime | None = None
        self.reasks = 0
        self.parse_failures = 0
        self.user: UserMessage | None = None
        self.published: list[tuple[str, workflow.ActivityHandle[list[str]]]] = []
        # Events waiting for the next bookkeeping activity to carry them.
        self.pending: list[TurnStarted | TurnCompleted] = []
        # Revision 2: the variables sent to begin_turn, and what it ran of steps 4-5.
        self.variables: dict[str, Any] | None = None
        self.opened: io.Opened | None = None

    def _ids(self) -> dict[str, str]:
        t = self.turn
        return {"conversation_id": t.conversation_id, "user_id": t.user_id,
                "service": t.service}

    def _variables(self) -> dict[str, Any]:
        """Built-ins (from the workflow clock: deterministic), then the turn's own;
        those begin_turn rendered with, when it ran steps 4-5."""
        if self.variables is not None:
            return dict(self.variables)
        now = workflow.now()
        builtins = {"today": now.date().isoformat(), "weekday": now.strftime("%A"),
                    "user_id": self.turn.user_id, "conversation_id": self.turn.conversation_id}
        return {**builtins, **self.turn.variables, "message": self.turn.message}

    # -- begin_turn runs steps 4 and 5 when it can (revision 2) ------------------------
    def opening(self) -> io.TurnOpening:
        """What begin_turn needs for steps 4 and 5 (the spec is not known yet:
        begin_turn decides whether the service lets it run them)."""
        return io.TurnOpening(variables=self._variables(), raw_message=self.turn.message,
                              events=[TurnStarted(**self._event_ids("turn_started"))])

    def take_opened(self, opening: io.TurnOpening, opened: io.Opened) -> None:
        self.variables, self.opened = opening.variables, opened

    @staticmethod
    def _render(template: str, variables: dict[str, Any]) -> str:
        try:
            return render_template(template, variables)
        except TurnstileError as exc:
            raise TurnStopped(TurnStatus.FAILED, exc) from exc

    # -- 2. system message (+ transformer) -----------------------------------------
    async def system_message(self) -> str:
        system = self._render(self.spec.system_prompt, self._variables())
        if self.pipe.system_transformer:
            out = await self.s.activity(
                io.transform_system_message, io.TransformSystemInput(
                    **self._ids(), system_message=system, variables=self.turn.variables),
                f"system transformer {self.pipe.system_transformer}",
                TurnStatus.FAILED, options=pipeline_options())
            system = out.system_message
        return system

    # -- 3. user message -------------------------------------------------------------
    def user_message(self) -> UserMessage:
        text = self._render(self.spec.user_template, self._variables())
        return UserMessage(raw=self.turn.message, text=text, unaugmented=text)

    # -- 4 / 17. events -------------------------------------------------------------
    # An event rides with the bookkeeping next to it: "turn started" (step 4)
    # with retrieval (step 5), delivered before the retriever runs; "turn
    # completed" (17) with the conversation's release, delivered once it is
    # released. With no such activity to carry it, an event is a local
    # activity of its own, started, not awaited: it goes out while the turn
    # goes on and is collected before the turn returns. A listener never
    # changes the turn's outcome.
    def _publish(self, event: TurnStarted | TurnCompleted) -> None:
        if not self.policy.events:
            return
        # Turns begun before revision 1 publish each event as a local activity
        # of its own, and replay so.
        if self.s.revision >= EVENTS_RIDE_ALONG:
            self.pending.append(event)
        else:
            self._start_publish(event)

    def _start_publish(self, event: TurnStarted | TurnCompleted) -> None:
        self.published.append((event.kind, workflow.start_local_activity(
            io.PUBLISH_EVENT, event, result_type=list[str], **event_options())))

    def take_events(self) -> list[TurnStarted | TurnCompleted]:
        """The events for the bookkeeping activity about to run to deliver."""
        pending, self.pending = self.pending, []
        return pending

    def publish_pending(self) -> None:
        """Events no bookkeeping activity carried (no retriever; no lock to
        release, or its release failed): a local activity each."""
        for event in self.take_events():
            self._start_publish(event)

    async def events_delivered(self) -> None:
        """Wait for the events started so far (a failed delivery is logged)."""
        published, self.published = self.published, []
        for kind, handle in published:
            try:
                await handle
            except (ActivityError, ApplicationError) as exc:
                workflow.logger.warning("%s not delivered: %s", kind, failure_reason(exc))

    def _event_ids(self, kind: str) -> dict[str, Any]:
        info = workflow.info()
        return {"event_id": f"{info.workflow_id}/{info.run_id}/{kind}",
                "workflow_id": info.workflow_id, "run_id": info.run_id, **self._ids(),
                "at": workflow.now().isoformat()}

    def turn_started(self) -> None:
        self.started_at = workflow.now()
        self.s.event("turn_started",
                     f"conversation {self.turn.conversation_id}, user {self.turn.user_id}")
        if self.opened is not None and self.opened.events_delivered:
            return  # begin_turn delivered it
        self._publish(TurnStarted(**self._event_ids("turn_started")))

    def turn_completed(self, result: TurnResult | None,
                       status: TurnStatus) -> None:
        elapsed = (workflow.now() - self.started_at).total_seconds() if self.started_at else 0.0
        s = self.s
        self._publish(TurnCompleted(
            **self._event_ids("turn_completed"), status=status, round_trips=s.round_trips,
            tool_calls=len(s.calls), usage=s.usage, duration_seconds=elapsed,
            error_type=result.error.type if result and result.error else None))

    # -- 5. retrieval augmentation -----------------------------------------------------
    async def retrieval(self, user: UserMessage) -> UserMessage:
        if not self.pipe.retriever:
            self.publish_pending()
            return user
        got = self.opened.retrieved if self.opened is not None else None
        if got is None:  # begin_turn did not retrieve: a local activity of its own
            got = await self._retrieve(user)
        if not got.snippets:
            self.s.event("retrieval", "nothing relevant found")
            return user
        self.s.event("retrieval", ", ".join(sn.doc_id for sn in got.snippets))
        try:
            return user.augmented(got.snippets, self.policy.retrieval_template)
        except TurnstileError as exc:
            raise TurnStopped(TurnStatus.FAILED, exc) from exc

    async def _retrieve(self, user: UserMessage) -> io.Retrieved:
        # A local activity: one marker in history, no task round trip.
        return await self.s.local(
            io.retrieve, io.RetrieveInput(**self._ids(), query=user.text, raw_message=user.raw,
                                          top_k=self.policy.retrieval_top_k,
                                          max_chars=self.policy.retrieval_max_chars,
                                          events=self.take_events()),
            f"retrieve ({self.pipe.retriever})", TurnStatus.FAILED,
            options=pipeline_local_options())

    # -- 6. multimodal content ------------------------------------------------------------
    def attachments(self, user: UserMessage) -> UserMessage:
        if not self.turn.attachments:
            return user
        try:
            parts = checked_attachments(self.turn.attachments, self.policy)
        except TurnstileError as exc:
            raise TurnStopped(TurnStatus.FAILED, exc) from exc
        self.s.event("attachments", ", ".join(p.type for p in parts))
        return replace(user, parts=parts)

    # -- 7. input guardrails ------------------------------------------------------------
    async def input_guardrails(self, user: UserMessage) -> None:
        if not self.pipe.input_guardrails:
            return
        verdict = await self.s.activity(
            io.input_guardrails, io.InputGuardrailsInput(
                **self._ids(), message=user.text, raw_message=user.raw,
                variables=self.turn.variables, attachments=user.attachment_meta()),
            "input guardrails", TurnStatus.FAILED, options=pipeline_options())
        if verdict.outcome == "pass":
            self.s.event("input_guardrails", "passed")
            return
        # Nothing has run yet: fail and fatal both end the turn before memory is written.
        refused = InputGuardrailFatal if verdict.outcome == "fatal" else InputGuardrailFailed
        self.s.event("input_guardrails", f"{verdict.outcome} ({verdict.guardrail})")
        raise TurnStopped(TurnStatus.FAILED, refused(f"{verdict.guardrail}: {verdict.message}"),
                          answer=verdict.message)

    # -- 8. streaming ---------------------------------------------------------------------
    def streaming(self) -> bool:
        self.s.event("streaming", "on (partial text in turn_stream)"
                     if self.policy.streaming else "off")
        return self.policy.streaming

    # -- 9. output format ------------------------------------------------------------------
    def output_format(self, user: UserMessage) -> tuple[UserMessage, dict[str, Any] | None]:
        out = self.pipe.output
        if out is None:
            return user, None
        self.s.event("output_format", f"{out.type_name} via {out.mode}")
        if out.mode == "json_schema":
            return user, out.response_format()
        return user.appended(format_instructions(out)), None

    # -- 11. moderation --------------------------------------------------------------------
    def start_moderation(self, user: UserMessage) -> None:
        """Started now, concurrently with the first model request."""
        if not self.pipe.moderator:
            return
        self.moderation = self.s.start(
            io.moderate, io.ModerateInput(**self._ids(), text=user.text, raw_message=user.raw),
            f"moderate ({self.pipe.moderator})", pipeline_options())

    async def check_moderation(self, wait: bool) -> None:
        """`wait=False` checks only a verdict that has already arrived (before a
        tool round: a flagged input runs no more tools); `wait=True` is the
        mandatory check before the answer is returned."""
        handle = self.moderation
        if handle is None or not (wait or handle.done()):
            return
        self.moderation = None
        try:
            result = await handle
        except ActivityError as exc:
            if self.policy.moderation_on_error == "allow":
                self.s.event("moderation",
                             f"unavailable, allowed by policy: {failure_reason(exc)}")
                return
            raise TurnStopped(TurnStatus.FAILED,
                              ModerationUnavailable(failure_reason(exc))) from exc
        if result.flagged:
            categories = ", ".join(result.categories) or "unspecified"
            message = self.policy.moderation_message.replace("{categories}", categories)
            self.s.event("moderation", f"flagged: {categories}")
            if wait:  # the answer to a flagged message is not kept as said
                await self.discard_answer("moderation")
            raise TurnStopped(TurnStatus.MODERATED, ModerationFlagged(
                f"{result.source} flagged the message: {categories}"), answer=message)
        self.s.event("moderation", f"passed ({result.source})")

    def cancel_moderation(self) -> None:
        if self.moderation is not None and not self.moderation.done():
            self.moderation.cancel()

    # -- 15. output guardrails -----------------------------------------------------------------
    async def output_guardrails(self, answer: str) -> Reask | None:
        if not self.pipe.output_guardrails:
            return None
        user = self.user
        verdict = await self.s.activity(
            io.output_guardrails, io.OutputGuardrailsInput(
                **self._ids(), answer=answer, user_message=user.text if user else "",
                raw_message=self.turn.message, attempt=self.reasks),
            "output guardrails", TurnStatus.FAILED, options=pipeline_options())
        s = self.s
        if verdict.outcome == "pass":
            s.event("output_guardrails", "passed")
            return None
        s.event("output_guardrails", f"{verdict.outcome} ({verdict.guardrail})")
        source = f"output_guardrail:{verdict.guardrail}"
        if verdict.outcome in ("fail", "fatal"):
            await self.discard_answer(source)
            refused = OutputGuardrailFatal if verdict.outcome == "fatal" else OutputGuardrailFailed
            raise TurnStopped(TurnStatus.FAILED, refused(f"{verdict.guardrail}: {verdict.message}"),
                              answer=verdict.message, compensate=verdict.outcome == "fatal")
        limit = self.policy.max_output_guardrail_reasks
        if self.reasks >= limit:
            await self.discard_answer(source)
            raise TurnStopped(TurnStatus.FAILED, OutputGuardrailRetriesExhausted(
                f"{verdict.guardrail} still refused the answer after {limit} "
                f"re-ask(s): {verdict.message}"), answer=verdict.message, compensate=False)
        self.reasks += 1
        mode: Literal["retry", "reprompt"] = "retry" if verdict.outcome == "retry" else "reprompt"
        return Reask(mode, verdict.guidance or verdict.message, source)

    # -- 16. parse to the return type ----------------------------------------------------------
    async def parse(self, answer: str) -> tuple[Reask | None, Any]:
        out = self.pipe.output
        if out is None:
            return None, answer
        parsed = await self.s.activity(
            io.parse_output, io.ParseOutputInput(service=self.turn.service, answer=answer),
            f"parse {out.type_name}", TurnStatus.FAILED,
            options=pipeline_options())
        if parsed.ok:
            self.s.event("parse", f"{out.type_name} ok")
            return None, parsed.value
        self.s.event("parse", f"{out.type_name} failed: {parsed.error[:160]}")
        if self.parse_failures >= self.policy.max_parse_retries:
            raise TurnStopped(TurnStatus.FAILED, OutputParseError(
                f"the answer is not a valid {out.type_name} after "
                f"{self.parse_failures} re-ask(s): {parsed.error}"))
        self.parse_failures += 1
        return Reask("parse", parse_reask(out.type_name, parsed.error), "parse_error"), None

    async def reask(self, r: Reask) -> None:
        """Prepare memory for asking the model again."""
        if r.kind == "retry":
            await self.discard_answer(r.source)
            return
        # Stored by the next model call, before it asks.
        self.s.defer([ChatMessage(role="user", content=r.text,
                                  attributes={attr.REPROMPT: r.source})])

    async def discard_answer(self, reason: str) -> None:
        """The refused answer is never sent to the model again, nor kept as said."""
        seq = self.s.answer_seq
        if seq is None:
            return
        await self.s.local(io.discard_message, io.DiscardInput(
            conversation_id=self.turn.conversation_id, seq=seq, reason=reason),
            "discard answer", TurnStatus.FAILED)
