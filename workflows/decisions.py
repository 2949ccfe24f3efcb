"""Reviewers' decisions on a turn's pending approvals (docs/contract.md,
"Approvals"): who may decide, what takes effect, what is refused.

A decision arrives as the `approve`/`reject` signals or the `review` update.
It takes effect only for a call that waits, from a reviewer the service's
approver policy allows (names compared as identities,
turnstile.engine.identity), and only once: the first decision stands, later
ones — and the approval deadline — are refused or ignored. A refused
decision is never silently dropped: it is in the status query, the log and
the audit log; through `review` the reviewer gets the reason as a
`DecisionRefused` error, and on success the decision that took effect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnstile.engine.approvals import approval_refusal
    from turnstile.engine.contract import ApprovalDecision
    from turnstile.engine.masking import mask_text
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.turn_input_rules import NOTE_MAX, clean_note
    from turnstile.engine.versions import NAMES_AS_IDENTITIES
    from workflows.state import TurnState


@dataclass(frozen=True)
class Refused:
    """A decision that was not applied, and why (already audited and in the
    status query's refused signals)."""

    reason: str


class Decisions:
    def __init__(self, s: TurnState, spec: Callable[[], ServiceSpec]) -> None:
        self.s, self.spec = s, spec

    def refusal(self, call_id: str, reviewer: str, *, replaying_rules: bool = True) -> str | None:
        """Why this decision may not be applied (None: it may).
        `replaying_rules=False` (an update's validator, never replayed) applies
        today's rules without asking which rules the turn's history followed."""
        s = self.s
        pending = s.pending.get(call_id)
        if call_id in s.decisions:
            return f"tool call {call_id!r} was already decided"
        if pending is None:
            return (f"no pending approval for tool call {call_id!r}; pending: "
                    f"{sorted(s.pending) or 'none'}")
        requester = s.turn.user_id if s.turn is not None else ""

        def by(identity: bool) -> str | None:
            return approval_refusal(self.spec().approvals, tool=pending.tool_name,
                                    reviewer=reviewer, requester=requester,
                                    by_identity=identity)

        today = by(True)
        if not replaying_rules:
            return today
        before = by(False)
        # Only where the two rules disagree does it matter which one this turn
        # follows: a decision taken before identities replays as it was taken.
        if (today is None) != (before is None) and not workflow.patched(NAMES_AS_IDENTITIES):
            return before
        return today

    def decide(self, call_id: str, approved: bool, reviewer: str, note: str) -> (
            ApprovalDecision | Refused):
        """The decision that took effect, or the reason it was refused (audited)."""
        s = self.s
        reason = self.refusal(call_id, reviewer)
        verb = "approve" if approved else "reject"
        kept_reviewer = clean_note(reviewer)[:200]
        if reason:
            pending = s.pending.get(call_id)
            s.refuse(clean_note(call_id)[:200], pending.tool_name if pending else "", verb,
                     kept_reviewer,
                     f"{verb} by {_quoted(kept_reviewer)} for {_quoted(call_id)} refused: "
                     f"{reason}")
            return Refused(reason)
        decision = s.decisions[call_id] = ApprovalDecision(
            tool_call_id=call_id, tool_name=s.pending[call_id].tool_name, approved=approved,
            reviewer=kept_reviewer, note=mask_text(clean_note(note))[:NOTE_MAX],
            decided_at=workflow.now().isoformat())
        return decision

    def reject_pending(self, reviewer: str, note: str) -> list[str]:
        """Reject every call that waits and has no decision yet, as `reviewer`
        with `note` (a steer: workflows/steering.py). The ids rejected; none
        when a decision came first for each."""
        s = self.s
        rejected = []
        for call_id, pending in s.pending.items():
            if call_id in s.decisions:
                continue
            s.decisions[call_id] = ApprovalDecision(
                tool_call_id=call_id, tool_name=pending.tool_name, approved=False,
                reviewer=clean_note(reviewer)[:200], note=note,
                decided_at=workflow.now().isoformat())
            rejected.append(call_id)
        return rejected


def _quoted(text: str) -> str:
    return repr(clean_note(text)[:200]).encode("ascii", "backslashreplace").decode("ascii")
