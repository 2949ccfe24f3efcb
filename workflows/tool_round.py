"""One round of the tool loop (design.md §2): the calls of one model response.

Several calls run concurrently, a single one alone; each result lands in the
memory slot reserved for it, so results reach the model in call order
whatever order they finish in. Calls the workflow settles itself (unknown
tool, rejection, disabled tool, retries exhausted) are written in one batch
with their audit rows.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io
    from turnstile.engine import attributes as attr
    from turnstile.engine.breakers import DISABLED, Breakers
    from turnstile.engine.contract import (
        ApprovalDecision,
        CallStatus,
        PendingApproval,
        ToolCallRecord,
        TurnInput,
        TurnStatus,
    )
    from turnstile.engine.masking import mask_json_text
    from turnstile.engine.messages import ChatMessage, ToolCall
    from turnstile.engine.specs import ServiceSpec, ToolSpec
    from turnstile.engine.turn_rules import parsed_arguments
    from workflows.state import TurnState, TurnStopped
    from workflows.tool_options import tool_options


# Patch marker: approvals validate the call first (turnstile.review_call).
REVIEW_BEFORE_APPROVAL = "review-before-approval"


@dataclass
class RoundWrites:
    """What the workflow itself must write after the round."""

    messages: list[tuple[int, ChatMessage]] = field(default_factory=list)
    audit: list[io.AuditEntry] = field(default_factory=list)
    decisions: list[ApprovalDecision] = field(default_factory=list)

    def settle(self, seq: int, call: ToolCall, status: CallStatus, text: str) -> None:
        self.messages.append((seq, ChatMessage(
            role="tool", content=text, tool_call_id=call.id, is_error=True,
            attributes={attr.TOOL_NAME: call.name, attr.OUTCOME: status.value})))
        self.audit.append(io.AuditEntry(call_id=call.id, tool_name=call.name,
                                        arguments=call.arguments, status="FAILED",
                                        error=f"{status.value}: {text[:300]}"))


class ToolRound:
    def __init__(self, state: TurnState, turn: TurnInput, spec: ServiceSpec,
                 breakers: Breakers) -> None:
        self.s, self.turn, self.spec, self.breakers = state, turn, spec, breakers
        self.writes = RoundWrites()

    async def run(self, calls: list[ToolCall], base_seq: int) -> None:
        records = [self.s.new_call(c) for c in calls]
        jobs = [self._one(c, r, base_seq + i)
                for i, (c, r) in enumerate(zip(calls, records, strict=True))]
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
        w = self.writes
        for seq, msg in sorted(w.messages, key=lambda x: x[0]):
            await self.s.append([msg], seq=seq,
                                audit=[a for a in w.audit if a.call_id == msg.tool_call_id],
                                decisions=[d for d in w.decisions
                                           if d.tool_call_id == msg.tool_call_id])
        refusals = self.s.take_refusals()
        if refusals:  # decisions refused while this round waited for approvals
            await self.s.append([], audit=refusals)
        for o in outcomes:  # the first failure ends the turn, after every call settled
            if isinstance(o, BaseException):
                raise o

    async def _one(self, call: ToolCall, rec: ToolCallRecord, seq: int) -> None:
        tool = self.spec.tool(call.name)
        loop = self.spec.loop
        if tool is None:
            names = ", ".join(sorted(self.s.tool_names))
            text = f"Tool {call.name!r} does not exist. Available tools: {names}."
            self._settle(rec, seq, call, CallStatus.UNKNOWN_TOOL, text, executed=False)
            if loop.on_unknown_tool == "fail":
                raise TurnStopped(TurnStatus.FAILED, "UnknownTool",
                                  f"the model called {call.name!r}, which does not exist",
                                  call_id=call.id)
            return
        if self.breakers.is_disabled(call.name):
            text = DISABLED.format(name=call.name, n=loop.breakers.consecutive_failures)
            self._settle(rec, seq, call, CallStatus.FAILED, text, executed=False)
            return
        decision = None
        if tool.requires_approval:
            reviewed = await self._review(call)
            if reviewed is not None and not reviewed.valid:
                # Never ask a reviewer about arguments that fail validation.
                self._settle(rec, seq, call, CallStatus.INVALID_ARGUMENTS, reviewed.error,
                             executed=False)
                self._argument_error(call, reviewed.error)
                return
            decision = await self._approval(call, rec, tool, reviewed)
        if decision is not None and not decision.approved:
            text = (f"The call to {call.name} was rejected by {decision.reviewer}"
                    + (f": {decision.note}" if decision.note else "") + ". It did not run.")
            self.writes.decisions.append(decision)
            self._settle(rec, seq, call, CallStatus.REJECTED, text, executed=False)
            if loop.on_rejection == "fail":
                raise TurnStopped(TurnStatus.FAILED, "ToolCallRejected", text, call_id=call.id)
            return
        self.s.event("tool_call", f"{call.name} {mask_json_text(call.arguments)[:120]}")
        try:
            out = await workflow.execute_activity(
                io.EXECUTE_TOOL,
                io.ToolExecInput(conversation_id=self.turn.conversation_id,
                                 user_id=self.turn.user_id, service=self.turn.service,
                                 call=call, result_seq=seq, approval=decision),
                result_type=io.ToolOutcome, summary=tool.summary or call.name,
                **tool_options(tool))
        except ActivityError as exc:
            cause = exc.cause
            reason = cause.message if isinstance(cause, ApplicationError) else str(cause or exc)
            text = f"{call.name} failed after its retries: {reason}"
            self._settle(rec, seq, call, CallStatus.FAILED, text, executed=True)
            if tool.fatal_on_failure:
                raise TurnStopped(TurnStatus.FAILED, "FatalToolFailure", text,
                                  call_id=call.id) from exc
            return
        status = CallStatus(out.status)
        self.s.finish(rec, status, out.preview)
        self._breaker(call.name, executed=status != CallStatus.INVALID_ARGUMENTS,
                      failed=out.is_error)
        if status == CallStatus.COMPLETED and tool.compensation:
            self.s.compensable.append((call, rec))
        if status == CallStatus.INVALID_ARGUMENTS:
            self._argument_error(call, out.preview)

    def _argument_error(self, call: ToolCall, text: str) -> None:
        loop = self.spec.loop
        n = self.s.argument_errors[call.name] = self.s.argument_errors.get(call.name, 0) + 1
        if loop.on_invalid_arguments == "fail" or n > loop.argument_error_budget:
            raise TurnStopped(TurnStatus.FAILED, "ToolArgumentError", text, call_id=call.id)

    def _settle(self, rec: ToolCallRecord, seq: int, call: ToolCall, status: CallStatus,
                text: str, executed: bool) -> None:
        self.s.finish(rec, status, text)
        self.writes.settle(seq, call, status, text)
        if status != CallStatus.UNKNOWN_TOOL:
            self._breaker(call.name, executed=executed, failed=True)

    def _breaker(self, name: str, executed: bool, failed: bool) -> None:
        if self.breakers.record(name, executed=executed, failed=failed):
            self.s.event("breaker", f"{name} disabled after "
                                    f"{self.spec.loop.breakers.consecutive_failures} "
                                    "consecutive failures")

    async def _review(self, call: ToolCall) -> io.ReviewedCall | None:
        """Validate a call before a reviewer sees it (None in histories recorded
        before this step existed: they replay without it)."""
        if not workflow.patched(REVIEW_BEFORE_APPROVAL):
            return None
        reviewed: io.ReviewedCall = await self.s.activity(
            io.REVIEW_CALL, io.ReviewCallInput(service=self.turn.service, call=call),
            io.ReviewedCall, f"review {call.name}", TurnStatus.FAILED)
        return reviewed

    async def _approval(self, call: ToolCall, rec: ToolCallRecord, tool: ToolSpec,
                        reviewed: io.ReviewedCall | None) -> ApprovalDecision:
        s = self.s
        now = workflow.now()
        timeout = timedelta(seconds=tool.approval_timeout_seconds)
        # The reviewer sees the call's full arguments (the record keeps them masked).
        arguments = parsed_arguments(call.arguments)
        highlights = ({f: arguments[f] for f in tool.review_fields if f in arguments}
                      if isinstance(arguments, dict) else {})
        s.pending[call.id] = PendingApproval(
            tool_call_id=call.id, tool_name=call.name, arguments=arguments,
            highlights=highlights, notes=reviewed.notes if reviewed else [],
            validated=reviewed is not None,
            requested_at=now.isoformat(), deadline=(now + timeout).isoformat())
        s.step = "awaiting_approval"
        s.event("awaiting_approval", f"{call.name} call {call.id}")
        await s.publish()
        try:
            await workflow.wait_condition(lambda: call.id in s.decisions, timeout=timeout)
        except TimeoutError:
            s.decisions[call.id] = ApprovalDecision(
                tool_call_id=call.id, tool_name=call.name, approved=False, reviewer="deadline",
                note=f"no decision within {tool.approval_timeout_seconds:g} s",
                decided_at=workflow.now().isoformat())
        finally:
            s.pending.pop(call.id, None)
        decision = s.decisions[call.id]
        decision.tool_name = call.name
        verdict = "approved" if decision.approved else "rejected"
        s.event("approval", f"{call.name} {verdict} by {decision.reviewer}")
        s.step = "tools"
        await s.publish()
        return decision
