"""The turn as one state machine (docs/design.md, "The turn's phases").

`TurnMachine` holds where a turn is (its phase: a `TurnPhase` while it runs,
its `TurnStatus` once it ended), the calls waiting for a reviewer, the
decisions taken on them and whether a new message steered the turn. Its
transitions are the only writers of these (tests/test_turn_machine_writers.py
checks that no workflow module writes them); each checks the table
`TRANSITIONS`, emits the turn's event for it and says whether it changes
the turn's search attributes (`Moved.publishes`: the workflow issues the
upsert, `TurnState.enter`, where the turn's history has it).

A transition the table does not allow raises `IllegalTransition`. In the
turn's own code that ends the turn `failed` with `UnexpectedError` naming
the phase and the error (AgentTurn.run), as any unexpected exception does:
never a hang. Ending (`end`, `compensate`) is legal from every phase, so a
turn can always end. The moves a signal handler makes (`decide`, `steer`,
`withdraw`) are checked by their callers first (`Decisions.refusal`) or
never raise (a steer that does not apply is ignored, and says why).

Pure and deterministic: safe in workflow code, table-tested without a server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from turnstile.engine.contract import (
    ApprovalDecision,
    PendingApproval,
    SteerSignal,
    TurnPhase,
    TurnStatus,
)
from turnstile.engine.errors import IllegalTransition
from turnstile.engine.turn_rules import AwaitApproval

Phase = TurnPhase | TurnStatus
# Receives each transition's event: (step, detail), as TurnState.event.
EventSink = Callable[[str, str], None]


class Move(StrEnum):
    """The transitions of a turn, in the order a turn meets them."""

    REFUSE = "refuse"  # the door refused the input (turnstile.engine.turn_input_rules)
    BEGIN = "begin"  # begin_turn is asked for the service, memory and the lock
    QUEUE = "queue"  # another turn holds the conversation: wait for it, visibly
    TAKE_CONVERSATION = "take_conversation"  # the queued turn holds it now
    BEGUN = "begun"  # the turn holds the conversation and knows its spec
    PREPARE = "prepare"  # steps 2-9
    CALL_MODEL = "call_model"  # a model request (also a continuation, a re-ask)
    START_ROUND = "start_round"  # the tool calls of one model response
    AWAIT_APPROVAL = "await_approval"  # a call of the round waits for a reviewer
    DECIDE = "decide"  # a decision on a waiting call (a reviewer's, the deadline's)
    WITHDRAW = "withdraw"  # a call stops waiting (decided, or the turn is cancelled)
    RESUME = "resume"  # the waiting call goes on with its decision ("decided")
    STEER = "steer"  # a new message of the user rejects the waiting calls
    REJECT_STEERED = "reject_steered"  # a call of the steered round: rejected, never waits
    COMPENSATE = "compensate"  # the saga undoes completed effects
    CANCEL = "cancel"  # `temporal workflow cancel`: the turn ends Canceled
    END = "end"  # the turn ends with its status


RUNNING: frozenset[Phase] = frozenset(TurnPhase)
ENDED: frozenset[Phase] = frozenset(TurnStatus)
ANY: frozenset[Phase] = RUNNING | ENDED
IN_ROUND: frozenset[Phase] = frozenset({TurnPhase.TOOLS, TurnPhase.AWAITING_APPROVAL})


@dataclass(frozen=True)
class Rule:
    """From which phases a move is legal, and where it leads: a phase, the
    turn's status ("status": the ending names it), or None (the phase stays)."""

    sources: frozenset[Phase]
    to: Phase | Literal["status"] | None
    event: str | None  # the step of the event it emits (None: none)
    publishes: bool  # it changes the turn's search attributes


TRANSITIONS: dict[Move, Rule] = {
    Move.REFUSE: Rule(frozenset({TurnPhase.STARTING}), TurnStatus.REFUSED, "turn_refused",
                      False),
    Move.BEGIN: Rule(frozenset({TurnPhase.STARTING}), TurnPhase.LOAD_MEMORY, None, False),
    Move.QUEUE: Rule(frozenset({TurnPhase.LOAD_MEMORY}), TurnPhase.QUEUED, "queued", True),
    Move.TAKE_CONVERSATION: Rule(frozenset({TurnPhase.QUEUED}), TurnPhase.LOAD_MEMORY, None,
                                 False),
    # Published only from the revision that makes a turn findable at its start.
    Move.BEGUN: Rule(frozenset({TurnPhase.LOAD_MEMORY}), TurnPhase.LOAD_MEMORY, "load_memory",
                     True),
    Move.PREPARE: Rule(frozenset({TurnPhase.LOAD_MEMORY}), TurnPhase.PREPARE, None, False),
    # After steps 2-9, after a round, and again for a continuation or a re-ask.
    Move.CALL_MODEL: Rule(frozenset({TurnPhase.PREPARE, TurnPhase.MODEL_CALL, TurnPhase.TOOLS}),
                          TurnPhase.MODEL_CALL, None, False),
    Move.START_ROUND: Rule(frozenset({TurnPhase.MODEL_CALL}), TurnPhase.TOOLS, None, False),
    # Calls of one round run concurrently: several may wait at once.
    Move.AWAIT_APPROVAL: Rule(IN_ROUND, TurnPhase.AWAITING_APPROVAL, "awaiting_approval",
                              True),
    Move.DECIDE: Rule(IN_ROUND, None, None, False),
    Move.WITHDRAW: Rule(ANY, None, None, False),
    # The first waiting call to go on moves the turn back to `tools`.
    Move.RESUME: Rule(IN_ROUND, TurnPhase.TOOLS, "approval", True),
    Move.STEER: Rule(ANY, None, "steered", False),  # or steer_ignored
    Move.REJECT_STEERED: Rule(IN_ROUND, None, "approval", False),
    # Also after an ending that broke (AgentTurn.run ends such a turn failed).
    Move.COMPENSATE: Rule(ANY - {TurnPhase.STARTING}, TurnPhase.COMPENSATING, None, False),
    # Published only in turns begun after patch `cancel-published`.
    Move.CANCEL: Rule(RUNNING, TurnStatus.CANCELLED, "turn_completed", True),
    Move.END: Rule(ANY, "status", "turn_completed", True),
}


@dataclass(frozen=True)
class Moved:
    """A transition taken: the phase it left and the one it reached, and
    whether the search attributes change (the workflow issues the upsert)."""

    move: Move
    before: Phase
    after: Phase
    publishes: bool


class TurnMachine:
    def __init__(self, on_event: EventSink) -> None:
        self._emit = on_event
        self._phase: Phase = TurnPhase.STARTING
        self._pending: dict[str, PendingApproval] = {}
        self._decisions: dict[str, ApprovalDecision] = {}
        self._steered: SteerSignal | None = None
        self._steered_calls: list[str] = []
        self._queued_behind = ""
        # Read-only views: only the transitions below write.
        self._pending_view = MappingProxyType(self._pending)
        self._decisions_view = MappingProxyType(self._decisions)

    # -- what the turn's code reads ------------------------------------------------
    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def pending(self) -> Mapping[str, PendingApproval]:
        """The calls waiting for a reviewer's decision, by call id."""
        return self._pending_view

    @property
    def decisions(self) -> Mapping[str, ApprovalDecision]:
        """The decision taken on each call that waited (or was steered), by call id."""
        return self._decisions_view

    @property
    def steered(self) -> SteerSignal | None:
        """The steer that applied (a new message of the user), if one did."""
        return self._steered

    @property
    def steered_calls(self) -> Sequence[str]:
        """The calls the steer rejected, in order."""
        return tuple(self._steered_calls)

    @property
    def queued_behind(self) -> str:
        """While queued: "queued behind turn X, ..." (docs/steering.md)."""
        return self._queued_behind

    # -- the transitions -----------------------------------------------------------
    def _move(self, move: Move, detail: str | None = None, *, to: Phase | None = None,
              publishes: bool = True, event: str | None = None) -> Moved:
        rule = TRANSITIONS[move]
        before = self._phase
        if before not in rule.sources:
            raise IllegalTransition(f"{move.value} from {before.value}: allowed from "
                                    f"{', '.join(sorted(p.value for p in rule.sources))}")
        if rule.to == "status":
            assert to is not None
            self._phase = to
        elif rule.to is not None:
            self._phase = rule.to
        step = event or rule.event
        if step is not None and detail is not None:
            self._emit(step, detail)
        return Moved(move, before, self._phase, rule.publishes and publishes)

    def refuse(self, problem: str) -> Moved:
        return self._move(Move.REFUSE, problem)

    def begin(self) -> Moved:
        return self._move(Move.BEGIN)

    def queue(self, behind: str) -> Moved:
        moved = self._move(Move.QUEUE, behind)
        self._queued_behind = behind
        return moved

    def take_conversation(self) -> Moved:
        moved = self._move(Move.TAKE_CONVERSATION)
        self._queued_behind = ""
        return moved

    def begun(self, stored_messages: int, *, findable: bool) -> Moved:
        return self._move(Move.BEGUN, f"{stored_messages} stored message(s)",
                          publishes=findable)

    def prepare(self) -> Moved:
        return self._move(Move.PREPARE)

    def call_model(self) -> Moved:
        return self._move(Move.CALL_MODEL)

    def start_round(self) -> Moved:
        return self._move(Move.START_ROUND)

    def await_approval(self, step: AwaitApproval) -> Moved:
        call_id = step.pending.tool_call_id
        if call_id in self._pending or call_id in self._decisions:
            raise IllegalTransition(f"{Move.AWAIT_APPROVAL.value}: call {call_id!r} already "
                                    "waited")
        self._pending[call_id] = step.pending
        return self._move(Move.AWAIT_APPROVAL, f"{step.call.name} call {step.call.id}")

    def decide(self, decision: ApprovalDecision, *, supersede: bool = False) -> ApprovalDecision:
        """A decision on a waiting call that has none (`supersede`: the
        deadline's, which a turn begun before patch `decision-beats-deadline`
        wrote over a decision of its own activation)."""
        call_id = decision.tool_call_id
        if call_id not in self._pending or (call_id in self._decisions and not supersede):
            raise IllegalTransition(f"{Move.DECIDE.value}: call {call_id!r} does not wait "
                                    "for a decision")
        self._move(Move.DECIDE)
        self._decisions[call_id] = decision
        return decision

    def withdraw(self, call_id: str) -> None:
        """The call no longer waits (its wait ended, however it ended)."""
        self._move(Move.WITHDRAW)
        self._pending.pop(call_id, None)

    def resume(self, call_id: str, tool_name: str) -> tuple[Moved, ApprovalDecision]:
        """The call that waited goes on with its decision."""
        decision = self._decisions.get(call_id)
        if decision is None or call_id in self._pending:
            raise IllegalTransition(f"{Move.RESUME.value}: call {call_id!r} has no decision "
                                    "or still waits")
        decision.tool_name = tool_name
        verdict = "approved" if decision.approved else "rejected"
        edited = " with edits" if decision.arguments is not None else ""
        moved = self._move(Move.RESUME, f"{tool_name} {verdict}{edited} by {decision.reviewer}")
        return moved, decision

    def steer(self, by: str, signal: SteerSignal, requester: str | None, *, reviewer: str,
              note: str, decided_at: str) -> list[str]:
        """A new message of the turn's user: every waiting call without a
        decision is rejected (as `reviewer`, with `note`). Ignored — with an
        event saying why — once steered, from another user, or when no call
        waits without a decision. The calls it rejected."""
        if self._steered is not None:
            self._move(Move.STEER, f"turn {by}: already steered by turn "
                                   f"{self._steered.turn_id}", event="steer_ignored")
            return []
        if requester is None or signal.user_id != requester:
            self._move(Move.STEER, f"turn {by}: not a message of this turn's user",
                       event="steer_ignored")
            return []
        rejected = [call_id for call_id in self._pending if call_id not in self._decisions]
        if not rejected:
            self._move(Move.STEER, f"turn {by}: no call waits for a decision",
                       event="steer_ignored")
            return []
        for call_id in rejected:
            self._decisions[call_id] = ApprovalDecision(
                tool_call_id=call_id, tool_name=self._pending[call_id].tool_name,
                approved=False, reviewer=reviewer, note=note, decided_at=decided_at)
        self._steered = signal.model_copy(update={"turn_id": by})
        self._steered_calls = list(rejected)
        self._move(Move.STEER, f"turn {by}: {note}; rejected {', '.join(rejected)}")
        return rejected

    def reject_steered(self, call_id: str, tool_name: str, *, reviewer: str, note: str,
                       decided_at: str) -> ApprovalDecision:
        """A call of the steered round that reaches its approval after the
        steer: rejected at once, as the waiting ones were."""
        if self._steered is None or call_id in self._decisions:
            raise IllegalTransition(f"{Move.REJECT_STEERED.value}: call {call_id!r}: the turn "
                                    "was not steered, or the call was decided")
        decision = self._decisions[call_id] = ApprovalDecision(
            tool_call_id=call_id, tool_name=tool_name, approved=False, reviewer=reviewer,
            note=note, decided_at=decided_at)
        self._steered_calls.append(call_id)
        self._move(Move.REJECT_STEERED, f"{tool_name} rejected: {note}")
        return decision

    def compensate(self) -> Moved:
        return self._move(Move.COMPENSATE)

    def cancel(self, round_trips: int) -> Moved:
        """Nothing waits any more (the search attributes say 0)."""
        moved = self._move(Move.CANCEL, f"cancelled, {round_trips} round trip(s)")
        self._pending.clear()
        return moved

    def end(self, status: TurnStatus, round_trips: int) -> Moved:
        """Nothing waits any more (the search attributes say 0)."""
        moved = self._move(Move.END, f"{status.value}, {round_trips} round trip(s)", to=status)
        self._pending.clear()
        return moved
