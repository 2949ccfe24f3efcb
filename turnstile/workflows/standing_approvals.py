"""Standing approvals in the turn (revision 8; docs/approvals.md, "Standing
approvals (grants)"): a call about to wait for a reviewer is first offered to
the grants (`turnstile.claim_grant`); one that covers it approves it, and the
call runs without waiting. A reviewer's approval that carries `grant` issues
one (`turnstile.issue_grant`, in the decision's handler: workflows/decisions.py),
and the turn's other waiting calls are offered to it at once.

Deterministic: the claims and issues are activities, their answers in history.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io
    from turnstile.engine.contract import ApprovalDecision, TurnStatus
    from turnstile.engine.grant_models import GRANT_REVIEWER_PREFIX, GrantOffer
    from turnstile.engine.grant_rules import default_constraints
    from turnstile.engine.messages import ToolCall
    from turnstile.workflows.state import TurnState
    from turnstile.workflows.tool_options import ActivityOptions

# A claim is one short transaction: a lost worker is noticed within this
# long (no heartbeat), and a database outage is waited out like memory's.
CLAIM_OPTIONS: ActivityOptions = {
    "start_to_close_timeout": timedelta(seconds=10),
    "schedule_to_close_timeout": timedelta(hours=1),
    "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1),
                                maximum_interval=timedelta(seconds=30)),
}


async def claim(s: TurnState, call: ToolCall, untrusted: list[str] | None = None
                ) -> io.GrantClaim:
    """The grant that covers `call`, claimed (one use, once), or what a
    reviewer may grant for it. `untrusted`: the call's sensitive arguments
    whose values came from untrusted content (none are known yet: the
    information-flow rules name them)."""
    turn = s.turn
    assert turn is not None
    result: io.GrantClaim = await s.activity(
        io.claim_grant, io.ClaimGrantInput(
            service=turn.service, call=call, conversation_id=turn.conversation_id,
            user_id=turn.user_id, execution_chain=s.chain, untrusted=untrusted or []),
        f"grant for {call.name}", TurnStatus.FAILED, options=CLAIM_OPTIONS)
    return result


async def offered(s: TurnState, call: ToolCall) -> io.GrantClaim | None:
    """`claim` for a call already waiting (from a decision's handler): None
    when the claim failed after its retries — the call keeps waiting."""
    turn = s.turn
    assert turn is not None
    try:
        result: io.GrantClaim = await s.execute(
            io.claim_grant, io.ClaimGrantInput(
                service=turn.service, call=call, conversation_id=turn.conversation_id,
                user_id=turn.user_id, execution_chain=s.chain),
            f"grant for {call.name}", CLAIM_OPTIONS)
    except ActivityError as exc:
        workflow.logger.warning("grant not claimed for waiting call %s: %s", call.id,
                                str(exc)[:200])
        return None
    return result


def covered(call: ToolCall, c: io.GrantClaim) -> ApprovalDecision:
    """The approval of a call a grant covers."""
    return ApprovalDecision(
        tool_call_id=call.id, tool_name=call.name, approved=True,
        reviewer=f"{GRANT_REVIEWER_PREFIX}{c.grant_id}",
        note=f"standing approval {c.grant_id} issued by {c.issued_by}",
        decided_at=workflow.now().isoformat(), grant_id=c.grant_id)


def offer(c: io.GrantClaim, arguments: Any) -> GrantOffer | None:
    """What a reviewer may grant for the call: the tool's ceiling, and
    equality on its default fields (None: the tool never takes grants)."""
    if c.ceiling is None:
        return None
    return GrantOffer(ceiling=c.ceiling, constraints=default_constraints(
        arguments if isinstance(arguments, dict) else {}, c.default_fields))
