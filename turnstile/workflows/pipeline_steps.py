"""The pipeline's steps around the tool loop (docs/pipeline.md): 2-9
(`prepare`, in the documented order) and 11 (moderation), with the events
of steps 4 and 17 (workflows/turn_events.py) and steps 15-16
(workflows/answer_steps.py) in their own rooms.

Deterministic code only: each step decides from the service spec (recorded
in history by `begin_turn`) and schedules the activity that runs the
service's component. A service without the component schedules nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io
    from turnstile.engine.contract import TurnInput, TurnStatus
    from turnstile.engine.date_ranges import date_variables
    from turnstile.engine.errors import (
        InputGuardrailFailed,
        InputGuardrailFatal,
        ModerationFlagged,
        ModerationUnavailable,
        TurnstileError,
    )
    from turnstile.engine.output_format import format_instructions
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.turn_rules import render_template
    from turnstile.engine.user_message import UserMessage, checked_attachments
    from turnstile.workflows.answer_steps import AnswerSteps
    from turnstile.workflows.state import TurnState, TurnStopped, failure_reason
    from turnstile.workflows.tool_options import pipeline_local_options, pipeline_options
    from turnstile.workflows.turn_events import TurnEvents, turn_ids


@dataclass(frozen=True)
class Prepared:
    """Steps 2-9 done: the system message as rendered (and transformed), the
    user message as the model gets it, and how the model is asked."""

    system: str
    user: UserMessage
    stream: bool  # step 8, decided once per turn
    response_format: dict[str, Any] | None  # step 9


class PipelineSteps:
    def __init__(self, state: TurnState, turn: TurnInput, spec: ServiceSpec) -> None:
        self.s, self.turn, self.spec = state, turn, spec
        self.pipe = spec.pipeline
        self.policy = spec.pipeline.policy
        self.moderation: workflow.ActivityHandle[io.ModerationResult] | None = None
        self.events = TurnEvents(state, turn, spec)  # steps 4 and 17
        self.answer = AnswerSteps(state, turn, spec)  # steps 15 and 16
        # Revision 2: the variables sent to begin_turn, and what it ran of steps 4-5.
        self.variables: dict[str, Any] | None = None
        self.opened: io.Opened | None = None

    def _ids(self) -> dict[str, str]:
        return turn_ids(self.turn)

    def _variables(self) -> dict[str, Any]:
        """Built-ins (from the workflow clock: deterministic), then the turn's own;
        those begin_turn rendered with, when it ran steps 4-5. The date ranges
        (turnstile.engine.date_ranges) need no revision: a turn in flight renders
        the template begin_turn recorded, which named none of them unless the
        turn's own variables gave them (and those still win)."""
        if self.variables is not None:
            return dict(self.variables)
        now = workflow.now()
        builtins = {"today": now.date().isoformat(), "weekday": now.strftime("%A"),
                    **date_variables(now.date()),
                    "user_id": self.turn.user_id, "conversation_id": self.turn.conversation_id}
        return {**builtins, **self.turn.variables, "message": self.turn.message}

    # -- begin_turn runs steps 4 and 5 when it can (revision 2) ------------------------
    def opening(self) -> io.TurnOpening:
        """What begin_turn needs for steps 4 and 5 (the spec is not known yet:
        begin_turn decides whether the service lets it run them)."""
        return io.TurnOpening(variables=self._variables(), raw_message=self.turn.message,
                              events=[self.events.started_event()])

    def take_opened(self, opening: io.TurnOpening, opened: io.Opened) -> None:
        self.variables, self.opened = opening.variables, opened

    async def prepare(self) -> Prepared:
        """Steps 2-9: the messages the model is asked with, and how."""
        self.s.machine.prepare()
        system = await self.system_message()  # 2. system message (+ transformer)
        user = self.user_message()  # 3. user message from its template
        # 4-5 (begin_turn ran them when it could: then nothing is scheduled here)
        # 4. "turn started" event (delivered while the turn goes on)
        self.events.turn_started(self.opened is not None and self.opened.events_delivered)
        user = await self.retrieval(user)  # 5. retrieval: the user message only
        user = self.attachments(user)  # 6. multimodal parts
        await self.input_guardrails(user)  # 7. input guardrails see the final message
        stream = self.streaming()  # 8. streaming, once per turn
        user, response_format = self.output_format(user)  # 9. output format
        self.answer.user = user
        return Prepared(system, user, stream, response_format)

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

    # -- 5. retrieval augmentation -----------------------------------------------------
    async def retrieval(self, user: UserMessage) -> UserMessage:
        if not self.pipe.retriever:
            self.events.publish_pending()
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
                                          events=self.events.take()),
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
                await self.answer.discard_answer("moderation")
            raise TurnStopped(TurnStatus.MODERATED, ModerationFlagged(
                f"{result.source} flagged the message: {categories}"), answer=message)
        self.s.event("moderation", f"passed ({result.source})")

    def cancel_moderation(self) -> None:
        if self.moderation is not None and not self.moderation.done():
            self.moderation.cancel()
