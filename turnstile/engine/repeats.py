"""The repeat breaker (docs/design.md, "Circuit breakers"; docs/semantics.md):
no repeated side effects from the model.

A small model may call the same tool with the same arguments again and
again (`createEmailTask` 15 times, 14 identical e-mails sent). Once
a call has completed in a turn, a later call of the same tool with the same
arguments is not run and not sent to a reviewer: its result tells the model
that the call already ran and what it returned. "The same" is by meaning
from revision 5: the validated call's comparison key
(turnstile.engine.equivalence: defaults filled in, strings NFC and trimmed,
the tool's declared equivalences such as e-mail addresses without case and
lists as sets), which the activity that validates the call computes and
history records (`ReviewedCall.repeat_key`, `ToolOutcome.repeat_key`).
Turns begun earlier compare canonical JSON (key order and spacing do not
count), and so does the check that needs no activity: a call identical as
JSON to one that completed is a repeat without being validated again.
Outcome `repeated`, `is_error` false (the effect the model asked for
exists; an error would invite another try), audit status `REPEATED`.

It applies to every tool unless the tool is declared `repeatable` (a read or
a status check, whose second call may answer differently) or the service's
`BreakerPolicy` names it in `repeatable_tools` or turns it off
(`repeat_identical=False`, or `enabled=False` for every breaker). Note that
`idempotent` does not exempt a tool: it means the same *call* (call id) may
run twice, not that a second call with a new id changes nothing. Of two
identical calls in one response (from revision 5: calls with the same
validated key), the later waits for the earlier's result
(workflows/tool_round.py) and is a repeat of it if it completed.

A model that repeats again after being told (`ANSWER_AFTER` repeats in a
turn) is asked for its answer without tools (`ANSWER_NOW`), once; the answer
goes through the same checks as any (an empty one is asked for once more).

A repeatable call does run again; from revision 10 one that completes with
the same arguments and the same result (its bounded, masked preview) as an
earlier call of the turn is a *same read* (`same_read`): it told the model
nothing new. When the same call has come back the same `ANSWER_AFTER` times,
its tool is withheld for the rest of the turn: no longer offered, and a call
of it is not run (`WITHHELD_TEXT`) and is a dead end
(turnstile.engine.dead_ends) — so the model goes on with the tools that are
left (the query answered, the e-mail is next), or answers; a small model that
queries the same thing again and again no longer ends at the round-trip cap.
A status check is polled on while its answer changes. The rule is off where
the repeat breaker is (`repeat_identical=False`, `enabled=False`).

Pure and deterministic: the workflow (workflows/tool_round.py) asks before a
call and records each completed call.
"""

from __future__ import annotations

import hashlib
import json

from turnstile.engine.approvals import canonical_json
from turnstile.engine.breakers import BreakerPolicy, Breakers, RanCall
from turnstile.engine.specs import ToolSpec

# Arguments longer than this are not compared (parsing them in workflow code
# costs time; no tool takes them by default: ToolSpec.max_argument_bytes).
REPEAT_KEY_LIMIT = 256 * 1024

REPEATED_TEXT = (
    "Not run again: {name} already ran in this turn with exactly these arguments (call "
    "{call_id}) and succeeded, so its effect exists once. What it returned: {preview} "
    "Do not call {name} again with the same arguments; go on with the next step, or "
    "answer the user.")
# A repeat by meaning (revision 5): the arguments differ only in ways that do
# not change the effect (case of an address, spacing, order of a set, ...).
REPEATED_BY_MEANING_TEXT = (
    "Not run again: {name} already ran in this turn with arguments that mean the same "
    "(call {call_id}; they differ only in case, spacing, order or defaults) and succeeded, "
    "so its effect exists once. What it returned: {preview} Do not call {name} again for "
    "the same effect; go on with the next step, or answer the user.")


# After this many repeats in a turn the model is stuck on a call it was told
# already ran: it is asked for its answer without tools (ANSWER_NOW), so a
# looping model ends its turn in one more request instead of at the
# round-trip cap.
ANSWER_AFTER = 2
ANSWER_NOW = (
    "You asked again for calls that already ran in this turn, with the same arguments; "
    "they were not run again. Their results are above. Do not call tools now: answer the "
    "user's request in plain text with what was done.")


WITHHELD_TEXT = (
    "Not run: {name} returned the same result for the same arguments {n} times in this turn, "
    "so it is no longer offered in this turn. Its results are above: go on with the next "
    "step, or answer the user.")


def repeat_key(name: str, arguments: str) -> str | None:
    """What makes two calls the same: the tool and its arguments as JSON
    values (raw text when they do not parse). None: not compared (too long)."""
    if len(arguments) > REPEAT_KEY_LIMIT:
        return None
    try:
        text = canonical_json(json.loads(arguments))
    except (ValueError, RecursionError):
        text = arguments
    return hashlib.sha256(f"{name}\x00{text}".encode("utf-8", "surrogatepass")).hexdigest()


def guarded(tool: ToolSpec | None, policy: BreakerPolicy) -> bool:
    """Does the repeat breaker apply to calls of `tool`?"""
    return (tool is not None and policy.enabled and policy.repeat_identical
            and not tool.repeatable and tool.name not in policy.repeatable_tools)


def earlier_run(breakers: Breakers, tool: ToolSpec | None, name: str,
                arguments: str) -> RanCall | None:
    """The call of this turn that completed with the same tool and arguments,
    when the breaker applies; None runs the call as usual."""
    if not guarded(tool, breakers.policy):
        return None
    key = repeat_key(name, arguments)
    return None if key is None else breakers.completed.get(key)


def needs_validated_key(breakers: Breakers, tool: ToolSpec | None, name: str,
                        in_round: int) -> bool:
    """From revision 5: must this call be validated (review_call) before it
    runs, for its comparison key? When the breaker applies and a call it could
    repeat exists: its tool completed a call in this turn, or the response
    holds `in_round` > 1 calls of it. (A call that needs approval is validated
    anyway.)"""
    return (guarded(tool, breakers.policy) and not breakers.is_disabled(name)
            and (name in breakers.completed_tools or in_round > 1))


def earlier_by_key(breakers: Breakers, tool: ToolSpec | None, key: str) -> RanCall | None:
    """The call of this turn that completed with the same validated key."""
    if not key or not guarded(tool, breakers.policy):
        return None
    return breakers.completed.get(key)


def remember(breakers: Breakers, name: str, arguments: list[str], ran: RanCall,
             keys: tuple[str, ...] = ()) -> None:
    """A call completed: later calls with any of `arguments` (the model's, and a
    reviewer's edited ones it ran with), or with any of the validated `keys`,
    are repeats of it. The first stays."""
    for args in arguments:
        key = repeat_key(name, args)
        if key is not None:
            breakers.completed.setdefault(key, ran)
    for key in keys:
        if key:
            breakers.completed.setdefault(key, ran)
    breakers.completed_tools.add(name)


def same_read(breakers: Breakers, tool: ToolSpec | None, name: str, arguments: str,
              preview: str) -> None:
    """From revision 10: record a completed call of a tool the breaker lets
    run again; one with the same arguments and result as an earlier call of
    the turn is a same read, and the `ANSWER_AFTER`th of the same call
    withholds its tool."""
    policy = breakers.policy
    if tool is None or guarded(tool, policy) or not (policy.enabled and policy.repeat_identical):
        return
    key = repeat_key(name, arguments)
    if key is None:
        return
    if breakers.reads.get(key) == preview:
        breakers.same_reads[key] = breakers.same_reads.get(key, 0) + 1
        if breakers.same_reads[key] >= ANSWER_AFTER:
            breakers.withheld.add(name)
    breakers.reads[key] = preview


def withheld_text(name: str) -> str:
    return WITHHELD_TEXT.format(name=name, n=ANSWER_AFTER + 1)


def repeated_text(name: str, earlier: RanCall, by_meaning: bool = False) -> str:
    """The result the model reads for a call the breaker did not run."""
    text = REPEATED_BY_MEANING_TEXT if by_meaning else REPEATED_TEXT
    return text.format(name=name, call_id=earlier.call_id,
                       preview=earlier.preview or "(no text)")
