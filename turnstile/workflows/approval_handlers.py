"""The turn's queries, signals and update (docs/contract.md): what an
operator sees of a running turn, and the reviewers' decisions on its pending
approvals (applied by workflows/decisions.py). A mixin of `AgentTurn`:
Temporal finds the handlers on the workflow class through its bases.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine.contract import (
        ApprovalDecision,
        Handlers,
        PendingApproval,
        TurnProgress,
    )
    from turnstile.engine.errors import DecisionRefused
    from turnstile.workflows.decisions import Decisions
    from turnstile.workflows.state import TurnState


class ApprovalHandlers:
    s: TurnState
    decisions: Decisions

    @workflow.query(name=Handlers.STATUS)
    def status(self) -> TurnProgress:
        s = self.s
        return TurnProgress(step=s.step, round_trips=s.round_trips, tool_calls=s.calls,
                            pending_approvals=list(s.pending.values()),
                            refused_signals=s.refused, refused_signals_total=s.refused_total,
                            events=s.events, queued_behind=s.queued_behind,
                            events_offset=s.events_dropped)

    @workflow.query(name=Handlers.PENDING_APPROVALS)
    def pending_approvals(self) -> list[PendingApproval]:
        return list(self.s.pending.values())

    # Signals and the update take their raw payloads: the product reads each
    # one (workflows/decisions.py), so none is dropped by the SDK's decoder.
    # One dynamic signal handler: `approve`, `reject`, and any other name
    # (refused and recorded).
    @workflow.signal(dynamic=True)
    async def decision_signal(self, name: str, args: Sequence[RawValue]) -> None:
        await self.decisions.on_signal(name, args)

    # Likewise one dynamic update handler: `review`; its validator refuses any
    # other name, and a payload over the size limits, before history.
    @workflow.update(dynamic=True)
    async def decision_update(self, name: str, args: Sequence[RawValue]) -> ApprovalDecision:
        """`review`: the decision that took effect; refused with the reason
        (DecisionRefused), audited."""
        return await self.decisions.on_review(args)

    @decision_update.validator
    def _validate_update(self, name: str, args: Sequence[RawValue]) -> None:
        if name != Handlers.REVIEW:
            raise ApplicationError(f"no update named {name[:60]!r}: this turn takes "
                                   f"{Handlers.REVIEW!r}", type=DecisionRefused.error_type,
                                   non_retryable=True)
        self.decisions.validate_review(args)
