"""The turn's queries, signals and update (docs/contract.md): what an
operator sees of a running turn, and the reviewers' decisions on its pending
approvals (applied by workflows/decisions.py). A mixin of `AgentTurn`:
Temporal finds the handlers on the workflow class through its bases.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine.contract import (
        ApprovalDecision,
        ApproveSignal,
        Handlers,
        PendingApproval,
        RejectSignal,
        ReviewInput,
        TurnProgress,
    )
    from turnstile.engine.errors import DecisionRefused
    from workflows.decisions import Decisions, Refused
    from workflows.state import TurnState


class ApprovalHandlers:
    s: TurnState
    decisions: Decisions

    @workflow.query(name=Handlers.STATUS)
    def status(self) -> TurnProgress:
        s = self.s
        return TurnProgress(step=s.step, round_trips=s.round_trips, tool_calls=s.calls,
                            pending_approvals=list(s.pending.values()),
                            refused_signals=s.refused, events=s.events,
                            events_offset=s.events_dropped)

    @workflow.query(name=Handlers.PENDING_APPROVALS)
    def pending_approvals(self) -> list[PendingApproval]:
        return list(self.s.pending.values())

    @workflow.signal(name=Handlers.APPROVE)
    def approve(self, signal: ApproveSignal) -> None:
        self.decisions.decide(signal.tool_call_id, True, signal.reviewer, signal.comment)

    @workflow.signal(name=Handlers.REJECT)
    def reject(self, signal: RejectSignal) -> None:
        self.decisions.decide(signal.tool_call_id, False, signal.reviewer, signal.reason)

    @workflow.update(name=Handlers.REVIEW)
    def review(self, decision: ReviewInput) -> ApprovalDecision:
        """The decision that took effect; refused with the reason (DecisionRefused)."""
        taken = self.decisions.decide(decision.tool_call_id, decision.approved,
                                      decision.reviewer, decision.note)
        if isinstance(taken, Refused):  # another decision won the race since validation
            raise ApplicationError(taken.reason, type=DecisionRefused.error_type,
                                   non_retryable=True)
        return taken

    @review.validator
    def _validate_review(self, decision: ReviewInput) -> None:
        reason = self.decisions.refusal(decision.tool_call_id, decision.reviewer,
                                        replaying_rules=False)
        if reason:
            raise ApplicationError(reason, type=DecisionRefused.error_type, non_retryable=True)
