"""Steps 15 and 16 (docs/pipeline.md): the model's answer through the
service's output guardrails and parsed to its return type, with bounded
re-asks; and the refused answer taken out of memory. Deterministic code
only: each step decides from the service spec and schedules the activity
that runs the service's component.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io, attributes as attr
    from turnstile.engine.contract import TurnInput, TurnStatus
    from turnstile.engine.errors import (
        OutputGuardrailFailed,
        OutputGuardrailFatal,
        OutputGuardrailRetriesExhausted,
        OutputParseError,
    )
    from turnstile.engine.messages import ChatMessage
    from turnstile.engine.output_format import parse_reask
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.user_message import UserMessage
    from turnstile.workflows.state import TurnState, TurnStopped
    from turnstile.workflows.tool_options import pipeline_options
    from turnstile.workflows.turn_events import turn_ids


@dataclass(frozen=True)
class Reask:
    """Ask the model again (steps 15/16): `retry` with the same messages
    (the refused answer is discarded), else with `text` as a new user message."""

    kind: Literal["retry", "reprompt", "parse"]
    text: str
    source: str  # recorded on the message (attribute turnstile.reprompt)


class AnswerSteps:
    def __init__(self, state: TurnState, turn: TurnInput, spec: ServiceSpec) -> None:
        self.s, self.turn = state, turn
        self.pipe = spec.pipeline
        self.policy = spec.pipeline.policy
        self.reasks = 0
        self.parse_failures = 0
        self.user: UserMessage | None = None  # the prepared user message (step 9's)

    # -- 15. output guardrails -----------------------------------------------------------------
    async def output_guardrails(self, answer: str) -> Reask | None:
        if not self.pipe.output_guardrails:
            return None
        user = self.user
        verdict = await self.s.activity(
            io.output_guardrails, io.OutputGuardrailsInput(
                **turn_ids(self.turn), answer=answer, user_message=user.text if user else "",
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

    async def checked(self, answer: str) -> tuple[Reask | None, Any]:
        """Steps 15 then 16: a re-ask, or the typed answer."""
        reask = await self.output_guardrails(answer)
        if reask is not None:
            return reask, None
        return await self.parse(answer)

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
