"""The turn's state machine (turnstile.engine.turn_machine), table-tested
without a server: every move from every phase is either in the table and
taken, or refused with the typed `IllegalTransition`; the transitions write
the pending calls, the decisions and the steer, emit their events and say
which change the search attributes. The rule that nothing else writes them:
tests/test_turn_machine_writers.py."""

from __future__ import annotations

import typing
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from turnstile.engine.approvals import arguments_digest
from turnstile.engine.contract import ApprovalDecision, SteerSignal, TurnPhase, TurnStatus
from turnstile.engine.errors import IllegalTransition, TurnstileError
from turnstile.engine.messages import ToolCall
from turnstile.engine.specs import ToolSpec
from turnstile.engine.tool_round_rules import approval_step
from turnstile.engine.turn_machine import (
    ANY,
    RUNNING,
    TRANSITIONS,
    Move,
    Phase,
    TurnMachine,
)
from turnstile.engine.turn_rules import AwaitApproval, FinalAnswer, NextStep, RunTools

NOW = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)
ALL_PHASES: list[Phase] = [*TurnPhase, *TurnStatus]


def call(call_id: str = "c1", name: str = "sendEmail") -> ToolCall:
    return ToolCall(id=call_id, name=name,
                    arguments='{"to": "ops@example.com", "subject": "hi", "body": "x"}')


def waiting(call_id: str = "c1") -> AwaitApproval:
    return approval_step(call(call_id), tool(["to", "subject"], 60.0), ["external: no"], NOW)


def tool(review_fields: list[str], timeout: float) -> ToolSpec:
    return ToolSpec(name="sendEmail", description="send", parameters={"type": "object"},
                    requires_approval=True, review_fields=review_fields,
                    approval_timeout_seconds=timeout)


def decision(call_id: str = "c1", approved: bool = True, reviewer: str = "carol",
             **extra: typing.Any) -> ApprovalDecision:
    return ApprovalDecision(tool_call_id=call_id, approved=approved, reviewer=reviewer,
                            decided_at=NOW.isoformat(), **extra)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __call__(self, step: str, detail: str) -> None:
        self.events.append((step, detail))


def machine() -> tuple[TurnMachine, Recorder]:
    rec = Recorder()
    return TurnMachine(rec), rec


# How to reach each phase by legal moves only.
ROUTES: dict[Phase, Callable[[TurnMachine], object]] = {
    TurnPhase.STARTING: lambda m: None,
    TurnPhase.LOAD_MEMORY: lambda m: m.begin(),
    TurnPhase.QUEUED: lambda m: (m.begin(), m.queue("queued behind turn t-0")),
    TurnPhase.PREPARE: lambda m: (m.begin(), m.prepare()),
    TurnPhase.MODEL_CALL: lambda m: (m.begin(), m.prepare(), m.call_model()),
    TurnPhase.TOOLS: lambda m: (m.begin(), m.prepare(), m.call_model(), m.start_round()),
    TurnPhase.AWAITING_APPROVAL: lambda m: (m.begin(), m.prepare(), m.call_model(),
                                            m.start_round(), m.await_approval(waiting("w0"))),
    TurnPhase.COMPENSATING: lambda m: (m.begin(), m.compensate()),
    TurnStatus.CANCELLED: lambda m: (m.begin(), m.cancel(0)),
    TurnStatus.REFUSED: lambda m: m.refuse("no"),
}
for _status in TurnStatus:
    ROUTES.setdefault(_status, lambda m, s=_status: (m.begin(), m.end(s, 0)))


def at(phase: Phase) -> TurnMachine:
    m, _ = machine()
    ROUTES[phase](m)
    assert m.phase == phase
    return m


# The moves that need nothing but the phase (the others need a waiting call).
BY_PHASE: dict[Move, Callable[[TurnMachine], object]] = {
    Move.REFUSE: lambda m: m.refuse("no"),
    Move.BEGIN: lambda m: m.begin(),
    Move.QUEUE: lambda m: m.queue("queued behind turn t-0"),
    Move.TAKE_CONVERSATION: lambda m: m.take_conversation(),
    Move.BEGUN: lambda m: m.begun(3, findable=True),
    Move.PREPARE: lambda m: m.prepare(),
    Move.CALL_MODEL: lambda m: m.call_model(),
    Move.START_ROUND: lambda m: m.start_round(),
    Move.AWAIT_APPROVAL: lambda m: m.await_approval(waiting("w9")),
    Move.COMPENSATE: lambda m: m.compensate(),
    Move.CANCEL: lambda m: m.cancel(1),
    Move.END: lambda m: m.end(TurnStatus.FAILED, 1),
}


def test_every_move_is_in_the_table_and_every_phase_is_reachable() -> None:
    assert set(TRANSITIONS) == set(Move)
    assert set(ROUTES) == set(ALL_PHASES)
    for move, rule in TRANSITIONS.items():
        assert rule.sources and rule.sources <= ANY, move
        assert rule.to is None or rule.to == "status" or rule.to in ALL_PHASES, move


@pytest.mark.parametrize("move", sorted(BY_PHASE), ids=str)
def test_a_move_is_taken_from_its_sources_and_refused_from_any_other_phase(move: Move) -> None:
    rule = TRANSITIONS[move]
    for phase in ALL_PHASES:
        m = at(phase)
        if phase in rule.sources:
            BY_PHASE[move](m)
            if isinstance(rule.to, TurnPhase | TurnStatus):
                assert m.phase == rule.to, (move, phase)
        else:
            with pytest.raises(IllegalTransition) as refused:
                BY_PHASE[move](m)
            assert m.phase == phase, "a refused move changes nothing"
            assert refused.value.error_type == "IllegalTransition"
            assert isinstance(refused.value, TurnstileError)  # fails the turn, not its task
            assert f"{move.value} from {phase.value}" in str(refused.value)


def test_a_turn_can_always_end() -> None:
    """Ending is legal from every phase, an ended one included (an ending that
    broke ends again as `failed`): no phase can keep a turn from ending."""
    for phase in ALL_PHASES:
        for status in TurnStatus:
            m = at(phase)
            moved = m.end(status, 2)
            assert m.phase == status and moved.publishes and m.pending == {}
        if phase != TurnPhase.STARTING:  # nothing ran yet: nothing to undo
            assert at(phase).compensate().after == TurnPhase.COMPENSATING


def test_an_ended_turn_does_not_go_on() -> None:
    for status in TurnStatus:
        for move in (Move.CALL_MODEL, Move.START_ROUND, Move.PREPARE, Move.BEGIN,
                     Move.AWAIT_APPROVAL, Move.CANCEL):
            with pytest.raises(IllegalTransition):
                BY_PHASE[move](at(status))


def test_a_turn_with_an_approval_goes_through_its_phases_with_events_and_attributes() -> None:
    m, rec = machine()
    published = [m.begin().publishes, m.begun(4, findable=True).publishes,
                 m.prepare().publishes, m.call_model().publishes, m.start_round().publishes]
    assert published == [False, True, False, False, False]
    step = waiting("c1")
    assert m.await_approval(step).publishes and m.phase == TurnPhase.AWAITING_APPROVAL
    assert dict(m.pending) == {"c1": step.pending}
    taken = m.decide(decision("c1", arguments={"to": "ops@example.com"}))
    assert m.decisions["c1"] is taken and "c1" in m.pending  # decided, not yet withdrawn
    m.withdraw("c1")
    moved, decided = m.resume("c1", "sendEmail")
    assert moved.publishes and moved.before == TurnPhase.AWAITING_APPROVAL
    assert m.phase == TurnPhase.TOOLS and decided.tool_name == "sendEmail"
    m.call_model()
    assert m.end(TurnStatus.COMPLETED, 1).publishes
    assert rec.events == [("load_memory", "4 stored message(s)"),
                          ("awaiting_approval", "sendEmail call c1"),
                          ("approval", "sendEmail approved with edits by carol"),
                          ("turn_completed", "completed, 1 round trip(s)")]


def test_findable_at_start_only_from_its_revision() -> None:
    m, _ = machine()
    m.begin()
    assert not m.begun(0, findable=False).publishes


def test_a_queued_turn_says_behind_whom_until_it_holds_the_conversation() -> None:
    m, rec = machine()
    m.begin()
    assert m.queue("queued behind turn t-1, waiting for an approval").publishes
    assert m.phase == TurnPhase.QUEUED and m.queued_behind.startswith("queued behind turn t-1")
    assert not m.take_conversation().publishes
    assert m.phase == TurnPhase.LOAD_MEMORY and m.queued_behind == ""
    assert rec.events == [("queued", "queued behind turn t-1, waiting for an approval")]


def test_two_calls_of_a_round_wait_at_once_and_the_first_decided_goes_back_to_tools() -> None:
    m = at(TurnPhase.TOOLS)
    m.await_approval(waiting("a"))
    m.await_approval(waiting("b"))
    m.decide(decision("a", approved=False))
    m.withdraw("a")
    m.resume("a", "sendEmail")
    assert m.phase == TurnPhase.TOOLS and list(m.pending) == ["b"]
    m.decide(decision("b"))
    m.withdraw("b")
    m.resume("b", "sendEmail")
    assert m.phase == TurnPhase.TOOLS and m.pending == {}
    with pytest.raises(IllegalTransition):
        m.await_approval(waiting("a"))  # a call waits once


def test_only_a_waiting_undecided_call_takes_a_decision() -> None:
    m = at(TurnPhase.AWAITING_APPROVAL)  # "w0" waits
    with pytest.raises(IllegalTransition):
        m.decide(decision("nobody"))
    m.decide(decision("w0"))
    with pytest.raises(IllegalTransition):
        m.decide(decision("w0", approved=False))
    # The deadline of a turn begun before `decision-beats-deadline` overwrote it.
    m.decide(decision("w0", approved=False, reviewer="deadline"), supersede=True)
    assert m.decisions["w0"].reviewer == "deadline"
    with pytest.raises(IllegalTransition):
        m.resume("w0", "sendEmail")  # still waiting: withdrawn first
    m.withdraw("w0")
    m.withdraw("w0")  # the wait ended once; withdrawing again changes nothing
    m.resume("w0", "sendEmail")
    with pytest.raises(IllegalTransition):
        m.resume("never", "sendEmail")


def test_a_steer_rejects_the_waiting_calls_once_and_says_why_it_is_ignored() -> None:
    m, rec = machine()
    ROUTES[TurnPhase.TOOLS](m)
    m.await_approval(waiting("a"))
    m.await_approval(waiting("b"))
    m.decide(decision("b"))  # a reviewer came first for b: it stands
    signal = SteerSignal(turn_id="t-2", user_id="alice")
    note = "the user sent a new message"
    assert m.steer("t-2", signal, "bob", reviewer="bob", note=note,
                   decided_at=NOW.isoformat()) == []
    assert m.steered is None
    assert m.steer("t-2", signal, "alice", reviewer="alice", note=note,
                   decided_at=NOW.isoformat()) == ["a"]
    assert m.steered == signal and list(m.steered_calls) == ["a"]
    assert (m.decisions["a"].approved, m.decisions["a"].reviewer) == (False, "alice")
    assert m.decisions["b"].approved
    assert m.steer("t-3", signal, "alice", reviewer="alice", note=note,
                   decided_at=NOW.isoformat()) == []
    late = m.reject_steered("c", "sendEmail", reviewer="alice", note=note,
                            decided_at=NOW.isoformat())
    assert not late.approved and list(m.steered_calls) == ["a", "c"]
    assert m.phase == TurnPhase.AWAITING_APPROVAL, "a steer moves no phase"
    assert rec.events[-4:] == [
        ("steer_ignored", "turn t-2: not a message of this turn's user"),
        ("steered", f"turn t-2: {note}; rejected a"),
        ("steer_ignored", "turn t-3: already steered by turn t-2"),
        ("approval", f"sendEmail rejected: {note}")]


def test_a_steer_with_nothing_waiting_is_ignored_and_no_steer_no_rejection() -> None:
    m, rec = machine()
    ROUTES[TurnPhase.TOOLS](m)
    signal = SteerSignal(turn_id="t-2", user_id="alice")
    assert m.steer("t-2", signal, "alice", reviewer="alice", note="n",
                   decided_at=NOW.isoformat()) == []
    assert rec.events == [("steer_ignored", "turn t-2: no call waits for a decision")]
    with pytest.raises(IllegalTransition):
        m.reject_steered("c", "sendEmail", reviewer="alice", note="n",
                         decided_at=NOW.isoformat())


def test_cancel_and_end_leave_nothing_waiting() -> None:
    m = at(TurnPhase.AWAITING_APPROVAL)
    moved = m.cancel(3)
    assert moved.publishes and m.phase == TurnStatus.CANCELLED and m.pending == {}


def test_what_the_machine_holds_cannot_be_written_from_outside() -> None:
    m = at(TurnPhase.AWAITING_APPROVAL)
    with pytest.raises(TypeError):
        m.pending["x"] = waiting("x").pending  # type: ignore[index]
    with pytest.raises(TypeError):
        m.decisions["w0"] = decision("w0")  # type: ignore[index]
    with pytest.raises(AttributeError):
        m.phase = TurnPhase.TOOLS  # type: ignore[misc]
    with pytest.raises(AttributeError):
        m.steered_calls.append("x")  # type: ignore[attr-defined]


def test_the_loops_next_step_has_an_await_approval_alternative() -> None:
    assert set(typing.get_args(NextStep)) == {FinalAnswer, RunTools, AwaitApproval}
    step = waiting("c1")
    assert step.call.id == "c1" and step.timeout_seconds == 60.0 and step.since == NOW
    p = step.pending
    assert (p.tool_call_id, p.tool_name, p.validated, p.notes) == (
        "c1", "sendEmail", True, ["external: no"])
    assert p.highlights == {"to": "ops@example.com", "subject": "hi"}
    assert p.arguments_digest == arguments_digest(p.arguments)
    assert (p.requested_at, p.deadline) == (NOW.isoformat(), "2026-12-05T08:01:00+00:00")
    unvalidated = approval_step(ToolCall(id="r", name="raw", arguments="not json"),
                                tool(["to"], 1.5), None, NOW)
    assert unvalidated.pending.arguments == "not json" and not unvalidated.pending.validated
    assert unvalidated.pending.highlights == {} and unvalidated.pending.notes == []


def test_the_design_doc_shows_the_table_the_code_has() -> None:
    """docs/design.md, "The turn's phases": one row per move, its sources,
    target and event as TRANSITIONS has them."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    section = text[text.index("## The turn's phases"):text.index("## Tool calling")]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")][1:]
    names = {frozenset(ANY): "any", frozenset(RUNNING): "running",
             frozenset(ANY - {TurnPhase.STARTING}): "any but starting"}
    expected = []
    for move, rule in TRANSITIONS.items():
        sources = names.get(rule.sources) or ", ".join(sorted(p.value for p in rule.sources))
        if isinstance(rule.to, TurnPhase | TurnStatus):
            to = rule.to.value
        else:
            to = "(stays)" if rule.to is None else "its status"
        expected.append([move.value, sources, to, rule.event or "—"])
    assert [[r[0], r[1], r[2], r[3].split(",")[0]] for r in rows] == expected
    assert [r[4] != "—" for r in rows] == [rule.publishes for rule in TRANSITIONS.values()]
