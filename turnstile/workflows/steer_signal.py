"""A new message steers a turn that waits for an approval (docs/steering.md).

The new turn's lock activity (activities/on_new_message.py) sends the `steer`
signal when the turn holding the conversation is parked on an approval and
the service's `on_new_message` is "steer". Here the holder applies it:

- it applies only when a call of it waits without a decision and the signal
  comes from the turn's own user; otherwise it is ignored (an event says so):
  a reviewer's decision that came first wins, a turn already ending ends as
  it would, and a second steer (another new message, or the same one sent
  again by a retried attempt) changes nothing;
- every call waiting for a decision is rejected, reviewer the user, note
  "the user sent a new message" (audited as any rejection, with its
  `approval_decision` row), and so is a call of the same round that reaches
  its approval afterwards;
- once the round has settled, the turn ends `steered` (TurnSteered) without
  asking the model again: the new turn sees all of it in memory. Completed
  effects are undone only where a rejection ends the turn anyway
  (`LoopPolicy.on_rejection="fail"`); then the lock is released.

A mixin of `AgentTurn` (the signal handler) and the rules the tool round and
the model loop ask. Deterministic code only; a turn that never receives the
signal issues exactly the commands it did before.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnstile.engine.contract import (
        ApprovalDecision,
        Handlers,
        SteerSignal,
        TurnStatus,
    )
    from turnstile.engine.errors import TurnSteered
    from turnstile.engine.messages import ToolCall
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.turn_input_rules import clean_note
    from turnstile.workflows.state import TurnState, TurnStopped

NEW_MESSAGE = "the user sent a new message"


class Steering:
    s: TurnState

    @workflow.signal(name=Handlers.STEER)
    def steer(self, signal: SteerSignal) -> None:
        """Applied or ignored (an event says which) by the turn's machine."""
        s = self.s
        requester = s.turn.user_id if s.turn is not None else None
        s.machine.steer(clean_note(signal.turn_id)[:200], signal, requester,
                        reviewer=clean_note(requester or "")[:200], note=NEW_MESSAGE,
                        decided_at=workflow.now().isoformat())


def steered_rejection(s: TurnState, call: ToolCall) -> ApprovalDecision:
    """A call of the steered round that reaches its approval after the steer:
    rejected at once, as the waiting ones were."""
    assert s.steered is not None and s.turn is not None
    return s.machine.reject_steered(call.id, call.name,
                                    reviewer=clean_note(s.turn.user_id)[:200],
                                    note=NEW_MESSAGE, decided_at=workflow.now().isoformat())


def steered_stop(s: TurnState, spec: ServiceSpec) -> TurnStopped:
    """The round of a steered turn has settled: the turn ends `steered`."""
    assert s.steered is not None
    return TurnStopped(
        TurnStatus.STEERED,
        TurnSteered(f"{NEW_MESSAGE} (turn {s.steered.turn_id}) while this turn waited for "
                    f"an approval: rejected {', '.join(s.steered_calls)}"),
        compensate=spec.loop.on_rejection == "fail")
