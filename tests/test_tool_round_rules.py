"""The tool loop's decisions (turnstile.engine.tool_round_rules), table-driven,
without a server. The full-turn tests (test_tool_semantics.py, test_approvals.py,
test_saga.py) keep one representative per rule to show the workflow wires each
decision to its effect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from turnstile.engine.breakers import BreakerPolicy, Breakers
from turnstile.engine.contract import ApprovalDecision, CallStatus
from turnstile.engine.errors import (
    FatalToolFailure,
    LoopDetected,
    RoundTripCapExceeded,
    ToolArgumentError,
    ToolCallRejected,
    TooManyToolCalls,
    UnknownToolError,
)
from turnstile.engine.specs import LoopPolicy, ToolSpec
from turnstile.engine.tool_round_rules import (
    Execute,
    OutcomeEffects,
    Settle,
    after_outcome,
    after_retries,
    after_review,
    before_call,
    round_stop,
)


def tool(name: str = "add", **kw: Any) -> ToolSpec:
    return ToolSpec(name=name, description="", parameters={"type": "object"}, **kw)


def loop(**kw: Any) -> LoopPolicy:
    return LoopPolicy(**kw)


# --- before a call -----------------------------------------------------------
@dataclass
class CallCase:
    id: str
    tool: ToolSpec | None
    disabled: bool
    policy: LoopPolicy
    expect_type: type
    status: CallStatus | None = None
    stop: type | None = None
    text: tuple[str, ...] = ()
    breaker_failure: bool = True
    needs_approval: bool = False


CALL_CASES = [
    CallCase("plain tool runs", tool(), False, loop(), Execute),
    CallCase("approval tool waits first", tool(requires_approval=True), False, loop(), Execute,
             needs_approval=True),
    CallCase("unknown tool: told the real ones", None, False, loop(), Settle,
             CallStatus.UNKNOWN_TOOL, None, ("'wipe' does not exist", "add, echo"),
             breaker_failure=False),
    CallCase("unknown tool, policy fail", None, False, loop(on_unknown_tool="fail"), Settle,
             CallStatus.UNKNOWN_TOOL, UnknownToolError, ("does not exist",),
             breaker_failure=False),
    CallCase("disabled by the breaker", tool(), True,
             loop(breakers=BreakerPolicy(consecutive_failures=4)), Settle, CallStatus.FAILED,
             None, ("disabled for the rest of this turn after 4 consecutive failures",)),
    CallCase("disabled wins over approval", tool(requires_approval=True), True, loop(), Settle,
             CallStatus.FAILED, None, ("disabled",)),
    CallCase("unknown wins over disabled", None, True, loop(), Settle, CallStatus.UNKNOWN_TOOL,
             None, ("does not exist",), breaker_failure=False),
]


@pytest.mark.parametrize("case", CALL_CASES, ids=[c.id for c in CALL_CASES])
def test_before_call(case: CallCase) -> None:
    name = case.tool.name if case.tool else "wipe"
    got = before_call(name, case.tool, ["echo", "add"], case.disabled, case.policy)
    assert type(got) is case.expect_type
    if isinstance(got, Execute):
        assert got.needs_approval is case.needs_approval
        return
    assert isinstance(got, Settle)
    assert got.status is case.status and not got.executed
    assert got.breaker_failure is case.breaker_failure
    assert type(got.stop) is case.stop if case.stop else got.stop is None
    for fragment in case.text:
        assert fragment in got.text


# --- after a review ---------------------------------------------------------
def decision(approved: bool, reviewer: str = "bob", note: str = "") -> ApprovalDecision:
    return ApprovalDecision(tool_call_id="c1", approved=approved, reviewer=reviewer, note=note)


@pytest.mark.parametrize("approved,note,policy,status,stop,text", [
    (True, "", loop(), None, None, None),
    (True, "", loop(on_rejection="fail"), None, None, None),
    (False, "not today", loop(), CallStatus.REJECTED, None,
     "The call to send was rejected by bob: not today. It did not run."),
    (False, "", loop(), CallStatus.REJECTED, None,
     "The call to send was rejected by bob. It did not run."),
    (False, "", loop(on_rejection="fail"), CallStatus.REJECTED, ToolCallRejected,
     "The call to send was rejected by bob. It did not run."),
], ids=["approved", "approved, fail policy", "rejected with a note", "rejected",
        "rejected, policy fail"])
def test_after_review(approved: bool, note: str, policy: LoopPolicy, status: CallStatus | None,
                      stop: type | None, text: str | None) -> None:
    got = after_review("send", decision(approved, note=note), policy)
    if status is None:
        assert got is None
        return
    assert got is not None and got.status is status and got.text == text
    assert not got.executed and got.breaker_failure  # a rejection counts as a failure in a row
    assert type(got.stop) is stop if stop else got.stop is None


def test_deadline_rejection_names_the_deadline() -> None:
    got = after_review("send", decision(False, reviewer="deadline", note="no decision within 5 s"),
                       loop())
    assert got is not None and "rejected by deadline: no decision within 5 s" in got.text


# --- after the activity failed its retries -----------------------------------
@pytest.mark.parametrize("fatal,stop", [(False, None), (True, FatalToolFailure)])
def test_after_retries(fatal: bool, stop: type | None) -> None:
    got = after_retries("queueMail", "smtp down", tool("queueMail", fatal_on_failure=fatal))
    assert got.status is CallStatus.FAILED and got.executed and got.breaker_failure
    assert got.text == "queueMail failed after its retries: smtp down"
    assert type(got.stop) is stop if stop else got.stop is None
    if got.stop is not None:
        assert got.stop.error_type == "FatalToolFailure" and str(got.stop) == got.text


# --- after an outcome ----------------------------------------------------------
@pytest.mark.parametrize("status,is_error,spec,errors_before,policy,expect,stop", [
    (CallStatus.COMPLETED, False, tool(), 0, loop(),
     OutcomeEffects(executed=True, failed=False, compensable=False, argument_error=False), None),
    (CallStatus.COMPLETED, False, tool(compensation="undo"), 0, loop(),
     OutcomeEffects(executed=True, failed=False, compensable=True, argument_error=False), None),
    (CallStatus.FAILED, True, tool(compensation="undo"), 0, loop(),
     OutcomeEffects(executed=True, failed=True, compensable=False, argument_error=False), None),
    (CallStatus.INTERRUPTED, True, tool(compensation="undo"), 0, loop(),
     OutcomeEffects(executed=True, failed=True, compensable=False, argument_error=False), None),
    (CallStatus.INVALID_ARGUMENTS, True, tool(), 0, loop(),
     OutcomeEffects(executed=False, failed=True, compensable=False, argument_error=True), None),
    (CallStatus.INVALID_ARGUMENTS, True, tool(), 2, loop(argument_error_budget=3),
     OutcomeEffects(executed=False, failed=True, compensable=False, argument_error=True), None),
    (CallStatus.INVALID_ARGUMENTS, True, tool(), 3, loop(argument_error_budget=3),
     None, ToolArgumentError),
    (CallStatus.INVALID_ARGUMENTS, True, tool(), 0, loop(on_invalid_arguments="fail"),
     None, ToolArgumentError),
], ids=["completed", "completed, compensable", "failed is never compensated",
        "interrupted is never compensated", "argument error within budget",
        "last argument error of the budget", "budget exceeded", "argument error, policy fail"])
def test_after_outcome(status: CallStatus, is_error: bool, spec: ToolSpec, errors_before: int,
                       policy: LoopPolicy, expect: OutcomeEffects | None,
                       stop: type | None) -> None:
    got = after_outcome(status, is_error, "b: must be >= 0", spec, errors_before, policy)
    if expect is not None:
        assert got == expect
    if stop is None:
        assert got.stop is None
    else:
        assert type(got.stop) is stop and str(got.stop) == "b: must be >= 0"
        assert got.argument_error and not got.executed  # still counted by the workflow


# --- before a round ------------------------------------------------------------
def breakers(history: list[str] | None = None, executions: int = 0,
             **policy: Any) -> Breakers:
    b = Breakers(BreakerPolicy(**policy))
    b.history, b.executions = list(history or []), executions
    return b


@pytest.mark.parametrize("round_trips,names,policy,state,stop,text", [
    (1, ["add"], loop(), breakers(), None, ""),
    (100, ["add"], loop(), breakers(), None, ""),
    (101, ["add"], loop(), breakers(), RoundTripCapExceeded, "round-trip cap 100"),
    (4, ["add", "add", "add"], loop(max_round_trips=3), breakers(), RoundTripCapExceeded,
     "round-trip cap 3"),
    (2, ["add", "add"], loop(), breakers(executions=14), TooManyToolCalls,
     "task too complex: more than 15 tool executions"),
    (2, ["add"], loop(), breakers(executions=14), None, ""),
    (2, ["add", "add"], loop(), breakers(executions=14, enabled=False), None, ""),
    (7, ["add"], loop(), breakers(["add", "echo"] * 3, max_alternations=5), LoopDetected,
     "alternated between echo and add 6 times"),
    (6, ["echo"], loop(), breakers(["add", "echo"] * 2 + ["add"], max_alternations=5), None, ""),
    (7, ["add"], loop(), breakers(["add", "echo"] * 3, max_alternations=6), None, ""),
], ids=["first round", "at the cap", "over the default cap", "over a configured cap",
        "too many executions", "exactly at the execution cap", "breakers off",
        "A/B loop", "A/B within tolerance", "A/B within a wider tolerance"])
def test_round_stop(round_trips: int, names: list[str], policy: LoopPolicy, state: Breakers,
                    stop: type | None, text: str) -> None:
    got = round_stop(round_trips, names, policy, state)
    if stop is None:
        assert got is None
    else:
        assert type(got) is stop and text in str(got)
        assert got is not None and got.error_type == stop.__name__


def test_disabled_tools_do_not_count_toward_the_execution_cap() -> None:
    state = breakers(executions=14)
    state.disabled.add("broken")
    assert round_stop(2, ["broken", "broken", "add"], loop(), state) is None
    assert isinstance(round_stop(2, ["add", "add"], loop(), state), TooManyToolCalls)


def test_the_cap_is_checked_before_the_breakers() -> None:
    got = round_stop(4, ["add"] * 20, loop(max_round_trips=3), breakers(executions=14))
    assert isinstance(got, RoundTripCapExceeded)
