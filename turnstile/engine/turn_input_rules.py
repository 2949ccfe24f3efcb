"""The door: what a turn accepts from outside, checked before it holds anything.

Every text that enters from a person or an operator — the turn's ids and
message, reviewer names, notes and reasons — is checked here by one rule per
field (docs/contract.md, "Input rules"). Pure functions: the workflow runs
them on its first activation, so a refused turn takes no lock, writes no row
and schedules nothing.

- **Ids** (`conversation_id`, `user_id`, `service` when given, reviewer
  names): 1 to 200 characters; no control or format characters (Unicode
  categories Cc and Cf: NUL, escapes, zero-width characters, bidi controls),
  no lone surrogates, no line or paragraph separators, no U+FFFD (the mark of
  text already lost in decoding), no leading or trailing whitespace.
- **Message**: at most 100,000 characters (the figure is in the refusal); no
  NUL (PostgreSQL text cannot hold it) and no lone surrogates (no payload or
  database can encode them). Other characters, newlines and tabs included,
  are the user's to send.
- **Variables**: strings in them (keys and values) follow the message's rule.
- **Notes and reasons** from reviewers: NUL and lone surrogates are replaced
  by U+FFFD and the text is cut at 4,000 characters (a note is kept, never
  refused: the decision it rides with matters more).
"""

from __future__ import annotations

import unicodedata

from turnstile.engine.contract import TurnInput
from turnstile.engine.safe_text import REPLACEMENT, safe_text, unsafe_text_at

ID_MAX = 200
MESSAGE_MAX = 100_000
NOTE_MAX = 4_000
_SEPARATORS = {"\u2028", "\u2029", "\u0085"}


def shown(value: str, limit: int = 60) -> str:
    """`value` as an error message may quote it: escaped (repr), storable, short."""
    text = safe_text(value)
    quoted = repr(text[:limit]) + ("..." if len(text) > limit else "")
    return quoted.encode("ascii", "backslashreplace").decode("ascii")


def id_problem(field: str, value: str) -> str | None:
    """Why `value` cannot be the id `field` (None: it can)."""
    if not value:
        return f"{field} is empty"
    if len(value) > ID_MAX:
        return f"{field} has {len(value):,} characters; the limit is {ID_MAX}"
    if value != value.strip():
        return f"{field} {shown(value)} starts or ends with whitespace"
    for i, ch in enumerate(value):
        if (unicodedata.category(ch) in {"Cc", "Cf", "Cs"} or ch in _SEPARATORS
                or ch == REPLACEMENT):
            return (f"{field} {shown(value)} holds {shown(ch)} at position {i}: ids are "
                    "printable text without control, format or separator characters")
    return None


def text_problem(field: str, value: str, limit: int) -> str | None:
    if len(value) > limit:
        return f"{field} has {len(value):,} characters; the limit is {limit:,}"
    where = unsafe_text_at(value)
    if where is not None:
        return (f"{field} holds a NUL or a lone surrogate at position "
                f"{_position(value)}: no store can hold it")
    return None


def _position(value: str) -> int:
    return next(i for i, ch in enumerate(value) if ch == "\x00" or "\ud800" <= ch <= "\udfff")


def turn_input_problem(turn: TurnInput) -> str | None:
    """Why the turn cannot be accepted (None: it can), naming the first rule broken."""
    for field, value in (("conversation_id", turn.conversation_id),
                         ("user_id", turn.user_id)):
        problem = id_problem(field, value)
        if problem:
            return problem
    if turn.service:
        problem = id_problem("service", turn.service)
        if problem:
            return problem
    problem = text_problem("message", turn.message, MESSAGE_MAX)
    if problem:
        return problem
    where = unsafe_text_at(turn.variables)
    if where is not None:
        return f"variables: {where} holds a NUL or a lone surrogate: no store can hold it"
    return None


def clean_note(note: str) -> str:
    """A reviewer's note or reason as it is kept: storable, at most NOTE_MAX characters."""
    return safe_text(note)[:NOTE_MAX]
