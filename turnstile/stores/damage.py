"""Damaged rows of memory: what they are, how they are read, how they are named.

A `chat_message` row is written by the product, but also by other programs
(docs/contract.md) and by hand, and a disk or a copy can damage one. A row the
product cannot read as a message is *damaged*: the same row fails every read,
so it is a data error, never an outage (activities.data_errors), and a turn on
its conversation ends at once with `DamagedRow` naming the conversation and
the row's `seq`. `message_damage` is the one rule, used by every reader of
memory (turnstile.stores.memory, the orphan repair in journal_repair) and by
`python starter.py check`, which lists every damaged row; `python starter.py
conversation quarantine` sets one aside (both: turnstile.stores.quarantine).

What is damaged (each reader relies on it):

- text that is not UTF-8 (SQLite stores any bytes in a TEXT column; the
  driver refuses to decode them). Such bytes are read as `Undecodable` values
  (`tolerant`), never as an error a retry could fix. PostgreSQL refuses
  invalid UTF-8 on write, so there the damage is in what the text says;
- a role outside system/user/assistant/tool, a value of the wrong type
  (a number where text belongs, a flag other than 0/1);
- `tool_calls` that is not a JSON list of calls (`id`, `name`, `arguments`
  text); `attributes` that is not a JSON object, or whose attributes the
  product reads have the wrong type (`turnstile.state` an object,
  `turnstile.augmented_user_message` text);
- text no store or payload can hold (NUL, a lone surrogate: the door's rule,
  turnstile.engine.turn_input_rules), JSON nested deeper than the decoder
  takes, text over `TEXT_MAX` characters.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from turnstile.engine import attributes as attr
from turnstile.engine.errors import DamagedRow
from turnstile.engine.safe_text import safe_text, unsafe_text_at

ROLES = frozenset({"system", "user", "assistant", "tool"})
# No column of a message holds more (a tool result above the claim-check
# threshold is stored as a reference; the door takes 100,000 characters).
TEXT_MAX = 16 * 1024 * 1024
# Attributes the product reads back with a type: name -> (type, in words).
_TYPED_ATTRIBUTES: dict[str, tuple[type | tuple[type, ...], str]] = {
    attr.STATE: (dict, "an object"),
    attr.AUGMENTED_USER_MESSAGE: (str, "text"),
    attr.TOOL_NAME: (str, "text"),
    attr.OUTCOME: (str, "text"),
    attr.WORKFLOW_ID: (str, "text"),
}
_TEXT_COLUMNS = ("tool_call_id", "created_at", "workflow_id", "execution_chain", "run_id")
_PLAIN_COLUMNS = ("role", "content", *_TEXT_COLUMNS)
_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON escape of NUL or of a surrogate (a pair is walked too; rare).
_UNSAFE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


class Undecodable(bytes):
    """A TEXT value whose bytes are not UTF-8, as `tolerant` reads it."""

    def __repr__(self) -> str:
        return f"<{len(self)} bytes, not UTF-8>"


def _lenient(raw: bytes) -> str | Undecodable:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return Undecodable(raw)


def is_decode_error(err: BaseException) -> bool:
    """`err` (or what it wraps) is SQLite's "Could not decode to UTF-8"."""
    orig = getattr(err, "orig", err)
    return isinstance(orig, sqlite3.OperationalError) and "decode to UTF-8" in str(orig)


@contextmanager
def tolerant(driver: Any) -> Iterator[None]:
    """Reads on the sqlite3 connection `driver` give `Undecodable` for text
    that is not UTF-8 instead of failing (other drivers: nothing changes)."""
    if not isinstance(driver, sqlite3.Connection):
        yield
        return
    before = driver.text_factory
    driver.text_factory = _lenient
    try:
        yield
    finally:
        driver.text_factory = before


def undecodable_in(names: Sequence[str], rows: Sequence[Sequence[Any]],
                   table: str) -> DamagedRow | None:
    """The error naming the first value of `rows` that is `Undecodable`
    (with the row's conversation and seq when they were selected)."""
    for row in rows:
        values = dict(zip(names, row, strict=False))
        bad = [n for n, v in values.items() if isinstance(v, Undecodable)]
        if bad:
            conv = values.get("conversation_id")
            seq = values.get("seq")
            return DamagedRow(shown(conv) if isinstance(conv, str) else "(unknown)",
                              seq if isinstance(seq, int) else None,
                              f"{bad[0]} is not UTF-8 text", table)
    return None


def shown(text: str, limit: int = 200) -> str:
    """An id as an error may carry it: storable, bounded."""
    return safe_text(text)[:limit]


class Damage(NamedTuple):
    """One damaged row: where, and what is wrong with it."""

    conversation_id: str
    seq: int
    what: str

    def line(self) -> str:
        """`starter.py check`'s line (docs/operating.md)."""
        return f"damaged: {self.conversation_id} seq {self.seq} {self.what}"


def _text_problem(column: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Undecodable):
        return f"{column} is not UTF-8 text"
    if not isinstance(value, str):
        return f"{column} holds a {type(value).__name__}, not text"
    if len(value) > TEXT_MAX:
        return f"{column} holds {len(value):,} characters (more than {TEXT_MAX:,})"
    if not storable(value):
        return f"{column} holds a NUL or a lone surrogate"
    return None


def _json(column: str, value: Any) -> tuple[Any, str | None]:
    """The decoded JSON of a column's text, or why it is damaged."""
    problem = _text_problem(column, value)
    if problem is not None:
        return None, problem
    try:
        decoded = json.loads(value)
    except (ValueError, RecursionError):
        return None, f"{column} is not JSON"
    # Decoded text holds NUL or a surrogate only from an escape (a raw one
    # does not parse): walk the value only when the text has one.
    where = unsafe_text_at(decoded) if _UNSAFE_ESCAPE.search(value) else None
    if where is not None:
        return None, f"{column} holds a NUL or a lone surrogate (at {shown(where, 60)})"
    return decoded, None


def _calls_problem(value: Any) -> str | None:
    calls, problem = _json("tool_calls", value)
    if problem is not None:
        return problem
    if not isinstance(calls, list):
        return f"tool_calls is a JSON {type(calls).__name__}, not a list of calls"
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not all(
                isinstance(call.get(k), str) for k in ("id", "name")) or not isinstance(
                call.get("arguments", "{}"), str):
            return f"tool_calls item {i} is not a call (id, name and arguments as text)"
    return None


def _attributes_problem(value: Any) -> str | None:
    attrs, problem = _json("attributes", value)
    if problem is not None:
        return problem
    if not isinstance(attrs, dict):
        return f"attributes is a JSON {type(attrs).__name__}, not an object"
    for name, (kind, words) in _TYPED_ATTRIBUTES.items():
        if name in attrs and attrs[name] is not None and not isinstance(attrs[name], kind):
            return f"attributes {name} is not {words}"
    return None


def _plain_text_ok(values: Mapping[str, Any]) -> bool:
    """The common case at a glance (every read of memory runs it): a role,
    a 0/1 flag, and text columns that are None or storable text."""
    if values.get("role", "user") not in ROLES:
        return False
    flag = values.get("is_error", 0)
    if type(flag) not in (int, bool) or flag not in (0, 1):
        return False
    for column in _PLAIN_COLUMNS:
        value = values.get(column)
        if value is not None and (type(value) is not str or len(value) > TEXT_MAX
                                  or not storable(value)):
            return False
    return True


def storable(text: str) -> bool:
    """No NUL and no lone surrogate (ASCII text at the cost of one memchr)."""
    return "\x00" not in text and (text.isascii() or _SURROGATE.search(text) is None)


def looks_sound(is_error: Any, texts: Sequence[Any], json_texts: Sequence[Any],
                attributes: Mapping[str, Any]) -> bool:
    """For a row that parsed into a message (its flag, its plain text
    columns, its JSON columns' text, its decoded attributes): what parsing
    does not check — storable text of the right type, the flag, the types of
    the attributes the product reads — at a glance. False: judge the row by
    `message_damage` (it may still be sound: a surrogate pair escaped)."""
    if type(is_error) not in (int, bool) or is_error not in (0, 1):
        return False
    for text in texts:
        if text is not None and (type(text) is not str or len(text) > TEXT_MAX
                                 or not storable(text)):
            return False
    for text in json_texts:
        if text is not None and (type(text) is not str or len(text) > TEXT_MAX
                                 or _UNSAFE_ESCAPE.search(text)):
            return False
    return all(attributes.get(name) is None or isinstance(attributes[name], kind)
               for name, (kind, _) in _TYPED_ATTRIBUTES.items())


def message_damage(values: Mapping[str, Any]) -> str | None:
    """Why a `chat_message` row (its selected columns by name) cannot be read
    as a message, or None. Columns not selected are not judged."""
    if _plain_text_ok(values):
        if values.get("tool_calls"):  # empty: no calls, as memory reads it
            problem = _calls_problem(values["tool_calls"])
            if problem is not None:
                return problem
        if values.get("attributes"):
            return _attributes_problem(values["attributes"])
        return None
    if "role" in values:
        role = values["role"]
        problem = _text_problem("role", role)
        if problem is not None:
            return problem
        if role not in ROLES:
            return f"role {shown(str(role), 40)!r} is not a role"
    problem = _text_problem("content", values.get("content"))
    if problem is not None:
        return problem
    for column in _TEXT_COLUMNS:
        problem = _text_problem(column, values.get(column))
        if problem is not None:
            return problem
    flag = values.get("is_error", 0)
    if isinstance(flag, Undecodable | str):
        return "is_error holds text, not 0 or 1"
    if flag not in (0, 1) or not isinstance(flag, bool | int):
        return f"is_error holds {shown(repr(flag), 40)}, not 0 or 1"
    if values.get("tool_calls"):  # empty: no calls, as memory reads it
        problem = _calls_problem(values["tool_calls"])
        if problem is not None:
            return problem
    if values.get("attributes"):
        return _attributes_problem(values["attributes"])
    return None


def part_damage(values: Mapping[str, Any]) -> str | None:
    """Why a `chat_message_part` row (an image of a message) cannot be read,
    or None: its type and texts must be text every sink can hold."""
    idx = values.get("idx")
    for column in ("type", "url", "data", "mime_type"):
        value = values.get(column)
        if column == "type" and value is None:
            return f"image part {idx}: type is missing"
        problem = _text_problem(column, value)
        if problem is not None:
            return f"image part {idx}: {problem}"
    return None


def check_row(values: Mapping[str, Any]) -> None:
    """Raise `DamagedRow` when the row is damaged (`message_damage`)."""
    problem = message_damage(values)
    if problem is not None:
        conv = values.get("conversation_id")
        seq = values.get("seq")
        raise DamagedRow(shown(conv) if isinstance(conv, str) else "(unknown)",
                         int(seq) if isinstance(seq, int) else None, problem)


def check_part(conversation_id: str, values: Mapping[str, Any]) -> None:
    """Raise `DamagedRow` when an image part of a message is damaged."""
    problem = part_damage(values)
    if problem is not None:
        seq = values.get("seq")
        raise DamagedRow(shown(conversation_id), int(seq) if isinstance(seq, int) else None,
                         problem, "chat_message_part")


def kept_value(value: Any) -> Any:
    """A value as JSON can keep it for the record: bytes (text that is not
    UTF-8, a BLOB) as {"bytes_hex": ...}, text made storable."""
    if isinstance(value, bytes):  # Undecodable text, or a BLOB
        return {"bytes_hex": bytes(value).hex()}
    if isinstance(value, str):
        return safe_text(value)
    return value


def damaged(rows: Sequence[Mapping[str, Any]]) -> list[Damage]:
    """Every damaged row of `rows` (each its columns by name)."""
    out = []
    for values in rows:
        problem = message_damage(values)
        if problem is not None:
            conv, seq = values.get("conversation_id"), values.get("seq")
            out.append(Damage(shown(conv) if isinstance(conv, str) else repr(conv),
                              int(seq) if isinstance(seq, int) else -1, problem))
    return out


__all__ = ["ROLES", "TEXT_MAX", "Damage", "Undecodable", "check_part", "check_row",
           "damaged", "is_decode_error", "kept_value", "looks_sound", "message_damage",
           "part_damage",
           "tolerant", "undecodable_in"]
