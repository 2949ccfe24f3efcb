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
- **Every field, walked** (`value_problem`, whatever fields TurnInput has):
  every string in it, keys included, holds no NUL and no lone surrogate;
  containers nest at most 32 deep and hold at most 10,000 values; integers
  fit in 64 bits and floats are finite (what every JSON reader takes); the
  field's strings add up to at most its budget (100,000 characters for the
  message and for `variables`, 4 MiB for `attachments`, whose inline data
  step 6 caps further by the service's policy).
- **Notes and reasons** from reviewers: NUL and lone surrogates are replaced
  by U+FFFD and the text is cut at 4,000 characters (a note is kept, never
  refused: the decision it rides with matters more).
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any

from pydantic import BaseModel

from turnstile.engine.contract import TurnInput
from turnstile.engine.safe_text import REPLACEMENT, safe_text, unsafe_text_at

ID_MAX = 200
MESSAGE_MAX = 100_000
NOTE_MAX = 4_000
DEPTH_MAX = 32
VALUES_MAX = 10_000
FIELD_CHARS_MAX = 100_000  # the budget of a field not named in FIELD_CHARS
FIELD_CHARS = {"attachments": 4 * 1024 * 1024}
_INT_BOUND = 2**64
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


def value_problem(field: str, value: Any, chars_max: int = FIELD_CHARS_MAX) -> str | None:
    """Why `value` (a decoded JSON value) cannot travel through the turn — in
    activity inputs, memory and the database — or None. Iterative, so no
    nesting overflows the walker itself."""
    stack: list[tuple[str, Any, int]] = [(field, value, 0)]
    values = chars = 0
    while stack:
        path, v, depth = stack.pop()
        values += 1
        if values > VALUES_MAX:
            return f"{field} holds more than {VALUES_MAX:,} values"
        if isinstance(v, str):
            chars += len(v)
            if chars > chars_max:
                return f"{field} holds more than {chars_max:,} characters of text"
            if unsafe_text_at(v) is not None:
                return (f"{path} holds a NUL or a lone surrogate at position "
                        f"{_position(v)}: no store can hold it")
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if not -_INT_BOUND < v < _INT_BOUND:
                return f"{path} holds an integer beyond 64 bits"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return f"{path} holds {v!r}: numbers must be finite"
        elif isinstance(v, dict | list | tuple):
            if depth >= DEPTH_MAX:
                return f"{path} nests deeper than {DEPTH_MAX} levels"
            if isinstance(v, dict):
                for k, item in v.items():
                    key = str(k)
                    where = f"{path}.{safe_text(key)[:40]}"
                    chars += len(key)
                    if unsafe_text_at(key) is not None:
                        return f"{where}: a key holds a NUL or a lone surrogate"
                    stack.append((where, item, depth + 1))
            else:
                stack.extend((f"{path}.{i}", item, depth + 1) for i, item in enumerate(v))
        else:
            return f"{path} holds a {type(v).__name__}, not a JSON value"
    return None


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
    # Every field, by walking its value: a field added later is covered too.
    for field in type(turn).model_fields:
        problem = value_problem(field, _plain(getattr(turn, field)),
                                FIELD_CHARS.get(field, FIELD_CHARS_MAX))
        if problem:
            return problem
    return None


def _plain(value: Any) -> Any:
    """A field's value as JSON would carry it (models as dicts)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="python")
    if isinstance(value, list) and any(isinstance(v, BaseModel) for v in value):
        return [v.model_dump(mode="python") if isinstance(v, BaseModel) else v for v in value]
    return value


def clean_note(note: str) -> str:
    """A reviewer's note or reason as it is kept: storable, at most NOTE_MAX characters."""
    return safe_text(note)[:NOTE_MAX]
