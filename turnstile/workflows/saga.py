"""The saga: when a turn fails (or is cancelled) after tools with
compensations completed, each is undone in reverse order of completion, and
what memory says of it becomes "rolled back" (is_error) — or, when an undo
fails or cannot remove the effect (an e-mail already sent), the turn ends
`compensation_failed` naming it. Deterministic workflow code."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io
    from turnstile.engine.contract import (
        CallStatus,
        RollbackCause,
        TurnErrorInfo,
        TurnInput,
        TurnStatus,
    )
    from turnstile.engine.masking import mask_text
    from turnstile.engine.specs import ServiceSpec
    from turnstile.workflows import turn_metrics as metrics
    from turnstile.workflows.state import TurnState, TurnStopped, failure_reason
    from turnstile.workflows.tool_options import compensation_options


async def roll_back(s: TurnState, spec: ServiceSpec | None, turn: TurnInput,
                    error: TurnErrorInfo, failing_call: str | None) -> TurnStatus:
    """Compensate completed calls in reverse order of completion."""
    assert spec is not None
    s.machine.compensate()
    cause = RollbackCause(type=error.type, message=error.message, call_id=failing_call)
    failed = []
    for call, rec in reversed(s.compensable):
        s.event("compensate", f"undo {call.name} ({call.id})")
        try:
            undo = await s.execute(
                io.compensate_tool,
                io.CompensateInput(conversation_id=turn.conversation_id,
                                   user_id=turn.user_id, service=turn.service, call=call,
                                   cause=cause, execution_chain=s.chain),
                f"undo {call.name} {call.id}",
                compensation_options(spec.tool(call.name), spec.loop))
        except ActivityError as exc:
            reason = failure_reason(exc)
            metrics.compensation(call.name, "failed")
            failed.append(rec)
            rec.status = CallStatus.COMPLETED
            s.event("compensation_failed", f"{call.name} ({call.id}): {reason}")
            try:
                await s.local(io.record_compensation_failure, io.CompensationFailure(
                    conversation_id=turn.conversation_id, call=call, cause=cause,
                    error=reason, execution_chain=s.chain),
                    f"record failed undo of {call.name}", TurnStatus.COMPENSATION_FAILED)
            except TurnStopped as unrecorded:  # bookkeeping failed for good: never a hang
                s.event("record_failed", f"{call.name} ({call.id}): {unrecorded}")
            continue
        metrics.compensation(call.name, "undone" if undo.undone else "effect_remains")
        if not undo.undone:  # e.g. an e-mail already sent: reported, never "rolled back"
            failed.append(rec)
            s.event("compensation_failed",
                    f"{call.name} ({call.id}): {mask_text(undo.description)}")
            continue
        rec.status, rec.rolled_back, rec.is_error = CallStatus.ROLLED_BACK, True, True
    if failed:
        names = ", ".join(f"{r.name} ({r.id})" for r in failed)
        error.message += f"; compensation failed, effect may remain: {names}"
        return TurnStatus.COMPENSATION_FAILED
    return TurnStatus.ROLLED_BACK
