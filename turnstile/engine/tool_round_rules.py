"""The decisions of the tool loop (docs/design.md, "Tool calling"), as pure functions.

The workflow (`workflows/tool_round.py`, `workflows/agent_turn.py`) does the
scheduling and the writing; these functions decide, from what the model asked
and what happened, what it does next:

- before a round: stop it (round-trip cap, a breaker) or run it;
- before a call: run it, wait for approval first, or settle it without running
  (unknown tool, a tool a breaker disabled, from revision 6 a call without the
  arguments its tool requires);
- after validation (calls that need approval): settle invalid arguments
  before any reviewer is asked, or wait for one (`approval_step`: the
  loop's `AwaitApproval` step);
- after a review: run the approved call, settle a rejected one;
- after the activity: a failure after retries goes back to the model (or ends
  the turn for a fatal tool); an outcome feeds the breakers, the saga, and the
  argument-error budget.

Deterministic and free of I/O: safe in workflow code, table-tested without a
server (`tests/test_tool_round_rules.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from turnstile.engine.approvals import arguments_digest
from turnstile.engine.breakers import DISABLED, Breakers, BreakerTripped
from turnstile.engine.contract import (
    ApprovalDecision,
    CallStatus,
    PendingApproval,
    SimilarEffect,
)
from turnstile.engine.dead_ends import NO_ARGUMENTS_TEXT, no_arguments, required_arguments
from turnstile.engine.errors import (
    FatalToolFailure,
    RoundTripCapExceeded,
    ToolArgumentError,
    ToolCallRejected,
    TurnstileError,
    UnknownToolError,
)
from turnstile.engine.flow import Provenance
from turnstile.engine.messages import ToolCall
from turnstile.engine.specs import LoopPolicy, ToolSpec
from turnstile.engine.turn_rules import AwaitApproval, parsed_arguments


@dataclass(frozen=True)
class Execute:
    """Run the call as an activity; wait for a reviewer first if `needs_approval`."""

    needs_approval: bool = False


@dataclass(frozen=True)
class Settle:
    """The workflow settles the call itself: `text` is its (error) result.

    `executed` counts it as a tool execution for the breakers; `breaker_failure`
    counts it as a failure in a row of that tool (an unknown tool has no row).
    `stop` ends the turn with that error once the round has settled."""

    status: CallStatus
    text: str
    executed: bool = False
    breaker_failure: bool = True
    stop: TurnstileError | None = None


CallDecision = Execute | Settle


@dataclass(frozen=True)
class OutcomeEffects:
    """What an executed call's outcome changes: the breakers' record, whether the
    saga may have to undo it, and whether it ends the turn."""

    executed: bool
    failed: bool
    compensable: bool
    argument_error: bool
    stop: TurnstileError | None = None


def round_stop(round_trips: int, names: list[str], loop: LoopPolicy,
               breakers: Breakers) -> TurnstileError | None:
    """Before a round (`round_trips` already counts it): the error that stops
    the turn instead, or None to run the round. Five calls in one response are
    one round trip."""
    if round_trips > loop.max_round_trips:
        return RoundTripCapExceeded(loop.max_round_trips)
    try:
        breakers.before_round(names)
    except BreakerTripped as trip:
        return trip
    return None


def before_call(name: str, tool: ToolSpec | None, known: list[str], disabled: bool,
                loop: LoopPolicy) -> CallDecision:
    """A call as the model asked for it, before anything runs."""
    if tool is None:
        text = f"Tool {name!r} does not exist. Available tools: {', '.join(sorted(known))}."
        stop = (UnknownToolError(f"the model called {name!r}, which does not exist")
                if loop.on_unknown_tool == "fail" else None)
        return Settle(CallStatus.UNKNOWN_TOOL, text, breaker_failure=False, stop=stop)
    if disabled:
        return Settle(CallStatus.FAILED,
                      DISABLED.format(name=name, n=loop.breakers.consecutive_failures))
    return Execute(needs_approval=tool.requires_approval)


def without_arguments(name: str, arguments: str, tool: ToolSpec,
                      loop: LoopPolicy) -> Settle | None:
    """From revision 6: a call without arguments of a tool that requires some
    is a dead end (turnstile.engine.dead_ends), settled without validating it
    or asking a reviewer (`on_invalid_arguments="fail"` still ends the turn
    with it); None for any other call."""
    required = required_arguments(tool)
    if not required or not no_arguments(arguments):
        return None
    text = NO_ARGUMENTS_TEXT.format(name=name, required=", ".join(required))
    stop = ToolArgumentError(text) if loop.on_invalid_arguments == "fail" else None
    return Settle(CallStatus.INVALID_ARGUMENTS, text, stop=stop)


def after_validation(error: str, argument_errors: int, loop: LoopPolicy) -> Settle:
    """A call that needs approval failed validation before any reviewer was
    asked: an argument error the model can correct (counted like one the tool
    reports). `argument_errors` excludes this one."""
    stop: TurnstileError | None = None
    if loop.on_invalid_arguments == "fail" or argument_errors + 1 > loop.argument_error_budget:
        stop = ToolArgumentError(error)
    return Settle(CallStatus.INVALID_ARGUMENTS, error, executed=False, stop=stop)


def approval_step(call: ToolCall, tool: ToolSpec, notes: list[str] | None,
                  now: datetime, reason: str | None = None,
                  similar_effects: list[SimilarEffect] | None = None,
                  provenance: Provenance | None = None) -> AwaitApproval:
    """A call whose tool requires approval, validated: the loop's next step
    for it is to wait for a reviewer (turn_rules.AwaitApproval). The reviewer
    sees the call's full arguments (its record keeps them masked), the
    tool's review fields first, the validation's notes (None: not
    validated), the deadline, for a tool that asks by condition (or by its
    information-flow rules), why, the conversation's earlier effects that
    look alike, and where the sensitive arguments' values came from."""
    arguments = parsed_arguments(call.arguments)
    highlights = ({f: arguments[f] for f in tool.review_fields if f in arguments}
                  if isinstance(arguments, dict) else {})
    timeout = timedelta(seconds=tool.approval_timeout_seconds)
    pending = PendingApproval(
        tool_call_id=call.id, tool_name=call.name, arguments=arguments,
        highlights=highlights, notes=notes or [], validated=notes is not None,
        arguments_digest=arguments_digest(arguments), reason=reason,
        similar_effects=similar_effects or [], provenance=provenance or {},
        requested_at=now.isoformat(), deadline=(now + timeout).isoformat())
    return AwaitApproval(call=call, pending=pending, since=now,
                         timeout_seconds=tool.approval_timeout_seconds)


def after_review(name: str, decision: ApprovalDecision, loop: LoopPolicy) -> Settle | None:
    """A reviewer's (or the deadline's) decision: None runs the call."""
    if decision.approved:
        return None
    text = (f"The call to {name} was rejected by {decision.reviewer}"
            + (f": {decision.note}" if decision.note else "") + ". It did not run.")
    stop = ToolCallRejected(text) if loop.on_rejection == "fail" else None
    return Settle(CallStatus.REJECTED, text, stop=stop)


def after_retries(name: str, reason: str, tool: ToolSpec) -> Settle:
    """The tool's activity failed after its retries: the error goes back to the
    model, unless the tool's failure means the task cannot be done."""
    text = f"{name} failed after its retries: {reason}"
    stop = FatalToolFailure(text) if tool.fatal_on_failure else None
    return Settle(CallStatus.FAILED, text, executed=True, stop=stop)


def after_outcome(status: CallStatus, is_error: bool, preview: str, tool: ToolSpec,
                  argument_errors: int, loop: LoopPolicy) -> OutcomeEffects:
    """An outcome the tool's activity returned. `argument_errors` counts this
    tool's argument errors in the turn so far, this one excluded."""
    invalid = status is CallStatus.INVALID_ARGUMENTS
    stop: TurnstileError | None = None
    if invalid and (loop.on_invalid_arguments == "fail"
                    or argument_errors + 1 > loop.argument_error_budget):
        stop = ToolArgumentError(preview)
    return OutcomeEffects(
        executed=not invalid, failed=is_error,
        compensable=status is CallStatus.COMPLETED and bool(tool.compensation),
        argument_error=invalid, stop=stop)
