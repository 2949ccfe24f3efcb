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
    from turnstile.engine import activity_io as io
    from turnstile.engine.approvals import arguments_digest
    from turnstile.engine.contract import ApprovalDecision, PendingApproval, TurnPhase
    from turnstile.engine.messages import ToolCall
    from turnstile.engine.specs import ToolSpec
    from turnstile.engine.turn_rules import parsed_arguments
    from turnstile.engine.versions import DECISION_BEATS_DEADLINE
    from workflows import turn_metrics as metrics
    from workflows.state import TurnState


async def await_decision(s: TurnState, call: ToolCall, tool: ToolSpec,
                         reviewed: io.ReviewedCall | None) -> ApprovalDecision:
    """The decision on `call`: a reviewer's, or the deadline's rejection."""
    now = workflow.now()
    timeout = timedelta(seconds=tool.approval_timeout_seconds)
    # The reviewer sees the call's full arguments (the record keeps them masked).
    arguments = parsed_arguments(call.arguments)
    highlights = ({f: arguments[f] for f in tool.review_fields if f in arguments}
                  if isinstance(arguments, dict) else {})
    s.pending[call.id] = PendingApproval(
        tool_call_id=call.id, tool_name=call.name, arguments=arguments,
        highlights=highlights, notes=reviewed.notes if reviewed else [],
        validated=reviewed is not None, arguments_digest=arguments_digest(arguments),
        requested_at=now.isoformat(), deadline=(now + timeout).isoformat())
    s.step = TurnPhase.AWAITING_APPROVAL
    s.event("awaiting_approval", f"{call.name} call {call.id}")
    metrics.approval_requested(call.name)
    await s.publish()
    try:
        await workflow.wait_condition(lambda: call.id in s.decisions, timeout=timeout)
    except TimeoutError:
        # A decision that came in the deadline's own activation stands.
        if call.id in s.decisions and workflow.patched(DECISION_BEATS_DEADLINE):
            pass
        else:
            s.decisions[call.id] = ApprovalDecision(
                tool_call_id=call.id, tool_name=call.name, approved=False,
                reviewer="deadline",
                note=f"no decision within {tool.approval_timeout_seconds:g} s",
                decided_at=workflow.now().isoformat())
    finally:
        s.pending.pop(call.id, None)
    decision = s.decisions[call.id]
    decision.tool_name = call.name
    verdict = "approved" if decision.approved else "rejected"
    edited = " with edits" if decision.arguments is not None else ""
    s.event("approval", f"{call.name} {verdict}{edited} by {decision.reviewer}")
    metrics.approval_decided(call.name, "deadline" if decision.reviewer == "deadline"
                             and not decision.approved else verdict, now)
    s.step = TurnPhase.TOOLS
    await s.publish()
    return decision
