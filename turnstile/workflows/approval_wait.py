"""A call that needs approval waits for a reviewer's decision
(docs/contract.md, "Approvals"): it is shown as pending, with its full
arguments, until a decision arrives (workflows/decisions.py) or its deadline
rejects it. Deterministic code only: one timer, and the memo or search
attributes on entering and leaving the wait.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnstile.engine.contract import ApprovalDecision
    from turnstile.engine.turn_rules import AwaitApproval
    from turnstile.engine.versions import DECISION_BEATS_DEADLINE
    from turnstile.workflows import turn_metrics as metrics
    from turnstile.workflows.state import TurnState


async def await_decision(s: TurnState, step: AwaitApproval) -> ApprovalDecision:
    """The decision on the waiting call: a reviewer's, or the deadline's rejection."""
    call, timeout = step.call, timedelta(seconds=step.timeout_seconds)
    await s.enter(s.machine.await_approval(step))  # shown as pending, findable
    metrics.approval_requested(call.name)
    try:
        await workflow.wait_condition(lambda: call.id in s.decisions, timeout=timeout)
    except TimeoutError:
        # A decision that came in the deadline's own activation stands.
        if call.id in s.decisions and workflow.patched(DECISION_BEATS_DEADLINE):
            pass
        else:  # (a turn begun before that patch: the deadline's rejection wins)
            s.machine.decide(ApprovalDecision(
                tool_call_id=call.id, tool_name=call.name, approved=False,
                reviewer="deadline", by_deadline=True,
                note=f"no decision within {step.timeout_seconds:g} s",
                decided_at=workflow.now().isoformat()), supersede=True)
    finally:
        s.machine.withdraw(call.id)
    moved, decision = s.machine.resume(call.id, call.name)
    verdict = "approved" if decision.approved else "rejected"
    metrics.approval_decided(call.name, "deadline" if decision.by_deadline else verdict,
                             step.since)
    await s.enter(moved)
    return decision
