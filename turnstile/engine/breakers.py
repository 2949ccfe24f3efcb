"""Circuit breakers of one turn (docs/design.md, "Circuit breakers").

Pure and deterministic: the workflow feeds them what happened and asks what
to do next."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from turnstile.engine.errors import BreakerTripped, LoopDetected, TooManyToolCalls

__all__ = ["BreakerPolicy", "BreakerTripped", "Breakers", "alternations"]


class BreakerPolicy(BaseModel):
    enabled: bool = True
    consecutive_failures: int = 3  # same tool failing N times in a row → disabled
    max_tool_executions: int = 15  # per turn → "task too complex"
    max_alternations: int = 5  # A/B/A/B switches tolerated within the window
    alternation_window: int = 12  # most recent calls examined
    # The repeat breaker (turnstile.engine.repeats): a call with the same tool and
    # identical arguments as a call of this turn that completed is not run (nor
    # sent to a reviewer); the model is told what the earlier call returned.
    # Applies to every tool not declared `@tool(repeatable=True)` and not named
    # in `repeatable_tools`. Left out of the serialized form at their defaults,
    # so a spec reads (and is pinned, tests/test_versions.py) as before; turns
    # begun before it replay along their path (the patch REPEAT_BREAKER).
    repeat_identical: bool = Field(default=True, exclude_if=lambda v: v is True)
    repeatable_tools: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)


TOO_COMPLEX = ("task too complex: more than {cap} tool executions in one turn; split it into "
               "steps and ask again")
DISABLED = ("Tool {name} is disabled for the rest of this turn after {n} consecutive failures. "
            "Do not call it again; answer with what you have or explain what failed.")


@dataclass(frozen=True)
class RanCall:
    """A call of the turn that completed: what the repeat breaker tells the model."""

    call_id: str
    preview: str  # its result, bounded and masked (the full one is in memory)


@dataclass
class Breakers:
    policy: BreakerPolicy
    executions: int = 0
    history: list[str] = field(default_factory=list)  # tool names in call order
    failures_in_row: dict[str, int] = field(default_factory=dict)
    disabled: set[str] = field(default_factory=set)
    # Completed calls by repeat key (turnstile.engine.repeats.repeat_key).
    completed: dict[str, RanCall] = field(default_factory=dict)
    completed_tools: set[str] = field(default_factory=set)  # tools with a completed call
    repeats: int = 0  # calls the repeat breaker settled in this turn
    # Revision 10 (turnstile.engine.repeats.same_read): the last result of each
    # repeatable call by repeat key, how many times each came back the same,
    # and the tools withheld for it for the rest of the turn (recorded only in
    # turns begun at revision 10 or later, so empty in earlier ones).
    reads: dict[str, str] = field(default_factory=dict)
    same_reads: dict[str, int] = field(default_factory=dict)
    withheld: set[str] = field(default_factory=set)

    def before_round(self, names: list[str]) -> None:
        """Raise if running these calls would exceed the turn's limits."""
        if not self.policy.enabled:
            return
        runnable = [n for n in names if n not in self.disabled and n not in self.withheld]
        if self.executions + len(runnable) > self.policy.max_tool_executions:
            raise TooManyToolCalls(TOO_COMPLEX.format(cap=self.policy.max_tool_executions))
        switches = alternations(self.history + names, self.policy.alternation_window)
        if switches > self.policy.max_alternations:
            a, b = (self.history + names)[-2:]
            raise LoopDetected(
                f"loop detected: the model alternated between {a} and {b} {switches} times; "
                "the turn was stopped")

    def is_disabled(self, name: str) -> bool:
        return self.policy.enabled and name in self.disabled

    def is_withheld(self, name: str) -> bool:
        return name in self.withheld

    def record(self, name: str, executed: bool, failed: bool) -> bool:
        """Record one call's outcome; True when this failure disabled the tool."""
        self.history.append(name)
        if executed:
            self.executions += 1
        if not failed:
            self.failures_in_row[name] = 0
            return False
        self.failures_in_row[name] = self.failures_in_row.get(name, 0) + 1
        if (self.policy.enabled and name not in self.disabled
                and self.failures_in_row[name] >= self.policy.consecutive_failures):
            self.disabled.add(name)
            return True
        return False


def alternations(names: list[str], window: int) -> int:
    """Switches in the trailing A/B/A/B run within the last `window` calls."""
    recent = names[-window:]
    if len(recent) < 2 or recent[-1] == recent[-2]:
        return 0
    a, b = recent[-1], recent[-2]
    switches = 0
    for i in range(len(recent) - 1, 0, -1):
        pair = {recent[i], recent[i - 1]}
        if pair != {a, b} or recent[i] == recent[i - 1]:
            break
        switches += 1
    return switches
