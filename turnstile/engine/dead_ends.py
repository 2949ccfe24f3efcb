"""Dead ends: calls a model makes that can never run, as one kind
of failure, so a small model stuck on them ends its turn with a typed error
instead of at the round-trip cap.

A dead end is:

- a call without arguments (none, `{}` or `null`) of a tool whose schema
  requires some (settled without validating it: the model reads which
  arguments the tool needs);
- a call of a tool the breaker disabled (no longer offered from revision 6);
- a call of a tool that does not exist;
- an answer that is a call written as text that does not parse
  (turnstile.engine.answer_rules.unparsed_call: a bare `functions.NAME:`,
  a block naming an offered tool that is not a call), or a call written as
  text of a disabled tool.

A model response is a dead end when every call in it is one (or its answer
is one). After `DEAD_END_AFTER` such responses in a row the model is asked
once for its answer without tools (`ASK_NOW`); a dead end again (a call
written as text, parseable or not) ends the turn `failed` with `DeadEndCalls`
naming what it kept doing; an answer completes the turn. Arguments the model
can correct (wrong types, a missing field among others) are not dead ends:
they keep their own rule (`LoopPolicy.argument_error_budget`).

Pure and deterministic: safe in workflow code (workflows/model_loop.py,
from revision 6).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

from turnstile.engine import answer_rules
from turnstile.engine.specs import ToolSpec

# Responses in a row that are only dead ends, then the model is asked once
# for its answer without tools.
DEAD_END_AFTER = 2

ASK_NOW = (
    "Your last replies were calls that cannot run ({what}). Do not call tools now: answer "
    "the user's request in plain text with what was done and what could not be done.")
STOPPED = ("the model kept {what}, also when asked once for its answer without tools; the "
           "turn was stopped (what the tools did is kept)")
NO_ARGUMENTS_TEXT = (
    "Not run: {name} was called with no arguments, and it needs {required}. Call it with "
    "them, or answer the user without it.")

# Arguments longer than this are not "no arguments" (not parsed in workflow code).
_SHORT = 64


def required_arguments(tool: ToolSpec) -> list[str]:
    """The arguments `tool`'s schema requires (its recorded policy keeps them)."""
    required = tool.parameters.get("required")
    return [str(r) for r in required] if isinstance(required, list) else []


def no_arguments(arguments: str) -> bool:
    """Are these a call's arguments when it has none (empty, `{}`, `null`)?"""
    text = arguments.strip()
    if not text:
        return True
    if len(text) > _SHORT:
        return False
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return value is None or value == {}


def call_dead_end(name: str, arguments: str, tool: ToolSpec | None,
                  disabled: bool, withheld: bool = False) -> str | None:
    """What a call that cannot run does ("calling X with no arguments"), or
    None for a call that may run. `withheld`: from revision 10, a read that
    kept returning the same (turnstile.engine.repeats.same_read)."""
    if tool is None:
        return f"calling {name}, which does not exist"
    if disabled:
        return f"calling {name}, which was disabled after repeated failures"
    if withheld:
        return f"calling {name} again, which kept returning the same result"
    if required_arguments(tool) and no_arguments(arguments):
        return f"calling {name} with no arguments"
    return None


def text_dead_end(text: str, offered: list[str], disabled: Collection[str],
                  withheld: Collection[str] = ()) -> str | None:
    """What an answer that is a dead end does, or None for an answer (or a
    call written as text that parses, `ToolCallAsText`'s). `withheld`: from
    revision 10, the reads no longer offered (turnstile.engine.repeats)."""
    name = answer_rules.unparsed_call(text, offered)
    if name is not None:
        return f"writing {_quoted(text)} for {name}, a call that does not parse"
    name = answer_rules.tool_call_as_text(text, sorted(disabled))
    if name is not None:
        return f"calling {name}, which was disabled after repeated failures"
    name = answer_rules.tool_call_as_text(text, sorted(withheld))
    if name is not None:
        return f"calling {name} again, which kept returning the same result"
    return None


def written_call(text: str, offered: list[str]) -> str | None:
    """After the no-tools ask: the tool an answer still calls as text
    (parseable or not), or None for an answer."""
    name = answer_rules.unparsed_call(text, offered)
    return name if name is not None else answer_rules.tool_call_as_text(text, offered)


def _quoted(text: str) -> str:
    short = " ".join(text.split())
    return f"`{short[:60]}{'...' if len(short) > 60 else ''}`"


@dataclass
class DeadEnds:
    """One per turn: dead-end responses in a row and the latest one's kind."""

    in_row: int = 0
    what: str = ""

    def record(self, what: str | None) -> bool:
        """A response: a dead end (`what`) or not (None). True when the model
        is to be asked for its answer without tools now."""
        if what is None:
            self.in_row = 0
            return False
        self.in_row += 1
        self.what = what
        return self.in_row >= DEAD_END_AFTER
