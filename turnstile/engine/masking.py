"""Masking of personal data wherever a value is written outside the
conversation and the world tables: the audit log, status events, logs,
spans, the turn's result (docs/masking.md).

It works on parsed values, not raw text: a JSON argument string is parsed
first, and every string inside is masked; the values of sensitive fields
(`SENSITIVE_FIELDS`, or a caller's own set) are replaced whole. Pure: safe in
workflow code (its data is read when the module is imported).

- **E-mail addresses** are recognised however they are spelled: every run of
  text between spaces, quotes and brackets that holds an "@" or an escape
  (`\\u0040`, `&#64` with or without `;`, `&commat;`, `%40`, `%2540`, the
  full-width and small "@") is decoded — JSON `\\u` escapes, HTML entities
  and percent-encoding, layer after layer — and normalised (NFC, then
  NFKC), and addresses are found in it with Unicode
  letters, marks and digits in both parts (`josé` in NFD, Devanagari local
  parts and domains, a Cyrillic homograph, a quoted local part). Only a run
  holding an address is rewritten: decoded, its local parts masked
  (`a***@example.com`).
- **Phone numbers** are found by Google's libphonenumber (`phonenumbers`'s
  `PhoneNumberMatcher`, Leniency.VALID): numbers valid for their country,
  written with a `+` country code, or for `PHONE_REGION` without one. A number
  glued into an id (`demo-4155552671`) is part of the id and left alone.
  All but the last two digits are masked. Timestamps, durations, counts and
  ids are not phone numbers, and stay as written.
"""

from __future__ import annotations

import functools
import html
import json
import re
import unicodedata
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

import phonenumbers
import regex

from turnstile.engine.safe_text import safe_text

# Numbers written without a country code are read as North American (NANP)
# numbers; every other country's numbers are found when written with "+".
PHONE_REGION = "US"

# libphonenumber loads each region's metadata on first use, by importing a
# module. Inside workflow code (a preview masked in the turn's state) that
# import would run in Temporal's sandbox, which refuses phonenumbers' module
# lock: load every region now, when this module is imported (passed through,
# once per worker), so masking never imports anything during a turn.
phonenumbers.PhoneMetadata.load_all()

# A run of text that may hold an address: up to space, quotes and brackets.
_RUN = re.compile(r"[^\s\"<>()\[\]{},`|]{3,}")
# What a run holding an escaped or spelled "@" holds (others are left as they are).
_AT_MARKS = ("@", "%", "&", "\\", "\uff20", "\ufe6b")
_ANY_AT_MARK = re.compile("[" + re.escape("".join(_AT_MARKS)) + "]")

# Bounded repetitions (RFC 5321 caps a local part at 64 characters): an
# unbounded `[...]*@` backtracks quadratically over megabytes of text.
_LOCAL = r"[\p{L}\p{M}\p{N}_%+-](?:[\p{L}\p{M}\p{N}_.+-]|%(?!40)){0,63}"
_LABEL = r"[\p{L}\p{M}\p{N}_-]{1,63}"
_EMAIL = regex.compile(
    r"(\"[^\"\n]{1,64}\"|" + _LOCAL + r")@(" + _LABEL + r"(?:\." + _LABEL + r"){0,8}"
    r"\.[\p{L}\p{M}]{2,24})", regex.IGNORECASE)
_U_ESCAPE = re.compile(r"\\+u([0-9a-fA-F]{4})")
_DOTS = str.maketrans({"\u3002": ".", "\uff61": ".", "\uff0e": "."})
_MAYBE_PHONE = re.compile(r"\d(?:[\s().\-/]{0,3}\d){6}")
# Dates and times: text whose only seven digits are in them is not given to
# the matcher (most log lines), and text that is (a phone number elsewhere on
# the line) is given to it with them blanked out: it took the seconds of
# "13.105057" for a number, and a phone number and the year after it for one
# (tests/test_masking.py, generated times).
_TIMES = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
                    r"(?:Z|[+-]\d{2}:?\d{2})?)?")
_BLANK = "~"  # what a date or time is to the matcher: no digit, no phone punctuation
_GLUE = frozenset("-_")  # a number joined to letters by these is an id's part
# UUIDs (a run id on every SDK log line): any number the matcher finds that
# overlaps one is glued to a hex digit, or to "-" then one, and so left alone
# (a number spanning a whole UUID would have 32 digits), so text whose only
# seven digits are in UUIDs is not given to the matcher either (~0.1 ms a line).
_UUIDS = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                    r"[0-9a-fA-F]{12}")

SENSITIVE_FIELDS = frozenset({"password", "secret", "token", "api_key", "apikey",
                              "authorization", "phone", "phonenumber", "phone_number"})
MASKED = "***"


def decoded(text: str) -> str:
    """`text` with every escape layer decoded — JSON `\\u` escapes, HTML
    entities (with or without `;`), percent-encoding — and normalised (NFC,
    NFKC; the ideographic full stops are dots)."""
    for _ in range(6):
        before = text
        text = _U_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
        text = html.unescape(text)
        text = unquote(text, errors="replace")
        if text == before:
            break
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFC", text))
    return text.translate(_DOTS)


def _mask_addresses(text: str) -> str:
    if not _ANY_AT_MARK.search(text):  # no run of it can hold one
        return text
    out: list[str] = []
    done = 0  # text[:done] is written
    for run in _RUN.finditer(text):
        start, end = run.span()
        if start < done or not any(mark in run.group() for mark in _AT_MARKS):
            continue
        plain = decoded(run.group())
        if "@" not in plain:
            continue
        if plain.startswith("@") and start > done and text[start - 1] == '"':
            opening = text.rfind('"', max(done, start - 66), start - 1)
            if opening >= 0:  # a quoted local part: "name"@example.com
                start, plain = opening, decoded(text[opening:end])
        masked = _EMAIL.sub(lambda m: f"{m.group(1).lstrip(chr(34))[:1]}***@{m.group(2)}",
                            plain)
        if masked != plain:
            out += [text[done:start], masked]
            done = end
    return "".join(out) + text[done:] if out else text


def _mask_phones(text: str) -> str:
    if not _MAYBE_PHONE.search(text) or not _MAYBE_PHONE.search(
            _UUIDS.sub(" ", _TIMES.sub(" ", text))):
        return text
    out: list[str] = []
    done = 0
    # The matcher reads the text with its dates and times blanked out (same
    # length: what it finds is masked at the same place in `text`).
    scan = _TIMES.sub(lambda t: _BLANK * len(t.group()), text)
    for found in phonenumbers.PhoneNumberMatcher(scan, PHONE_REGION,
                                                 leniency=phonenumbers.Leniency.VALID):
        start, end = found.start, found.end
        before = scan[start - 2:start] if start >= 2 else scan[:start]
        after = scan[end:end + 2]
        if _glued(before[::-1]) or _glued(after):
            continue  # digits of an id (demo-4155552671), not a phone number
        digits = [ch for ch in found.raw_string if ch.isdigit()]
        out += [text[done:start], "*" * (len(digits) - 2) + "".join(digits[-2:])]
        done = end
    return "".join(out) + text[done:] if out else text


def _glued(near: str) -> bool:
    """`near` (the characters next to a number, nearest first) joins it to
    a word: a letter or digit, or "-"/"_" then one."""
    if not near:
        return False
    return near[0].isalnum() or (near[0] in _GLUE and len(near) > 1 and near[1].isalnum())


def mask_text(text: str) -> str:
    """Mask e-mail addresses' local parts and phone numbers in plain text."""
    if len(text) <= _REMEMBERED_CHARS:
        return _mask_short(str(text))
    return _mask_phones(_mask_addresses(text))


# Short texts recur: the values of a tool result's rows (names, addresses,
# dates) in every call and turn that reads them, the run and workflow ids on
# every log line and span of a turn. Their masked form is remembered (pure, so
# the same either way; bounded: at most 4,096 texts of <= 256 characters).
_REMEMBERED_CHARS = 256


@functools.lru_cache(maxsize=4096)
def _mask_short(text: str) -> str:
    return _mask_phones(_mask_addresses(text))


# What a database says about the row it refused: PostgreSQL's DETAIL ("Failing
# row contains (...)", "Key (v)=(...) already exists") and CONTEXT, HINT,
# QUERY, STATEMENT, WHERE lines (psycopg's diag fields), on a line of their
# own or after a written "\n"; SQLAlchemy's "[SQL: ...]" and "[parameters: ...]".
_DB_DETAIL = re.compile(
    r"(?:^|(?<=\n)|(?<=\\n))[ \t]*(DETAIL|CONTEXT|HINT|QUERY|STATEMENT|WHERE|LINE \d+):"
    r"[^\n]*?(?=\\n|\n|$)|\[(SQL|parameters): [\s\S]*?\](?=\\n|\n|$)", re.MULTILINE)
_DB_MARKS = ("DETAIL:", "CONTEXT:", "HINT:", "QUERY:", "STATEMENT:", "WHERE:", "LINE ",
             "[SQL: ", "[parameters: ")


def without_db_details(text: str) -> str:
    """`text` without what a database error says about the data it refused
    (each such part becomes `DETAIL: [removed]`, `[SQL: removed]`, ...)."""
    if not any(mark in text for mark in _DB_MARKS):
        return text

    def removed(m: re.Match[str]) -> str:
        if m.group(2):
            return f"[{m.group(2)}: removed]"
        return f"{m.group(1)}: [removed]"

    return _DB_DETAIL.sub(removed, text)


def mask_value(value: Any, sensitive: Iterable[str] = SENSITIVE_FIELDS) -> Any:
    """A copy of a parsed JSON-like value with every string masked and the
    values of sensitive keys replaced."""
    keys = {k.lower() for k in sensitive}

    def walk(v: Any, depth: int = 0) -> Any:
        if isinstance(v, str):
            nested = _json_in(v) if depth < MAX_NESTED_JSON else None
            if nested is not None:  # JSON inside a string: masked value by value
                return json.dumps(walk(nested, depth + 1), ensure_ascii=False)
            return mask_text(v)
        if isinstance(v, dict):
            return {k: (MASKED if str(k).lower() in keys else walk(x, depth))
                    for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x, depth) for x in v]
        return v

    return walk(value)


MAX_NESTED_JSON = 4  # JSON in a string in a string ...: decoded this deep


def _json_in(text: str) -> Any:
    """The object or list a string holds as JSON, else None."""
    if text.lstrip()[:1] not in ("{", "["):
        return None
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, (dict, list)) else None


def mask_json_text(text: str, sensitive: Iterable[str] = SENSITIVE_FIELDS) -> str:
    """Mask text that may be JSON: parsed and masked value by value when it
    parses (escapes decoded), masked as plain text otherwise. The result is
    safe to write anywhere (turnstile.engine.safe_text): decoded escapes of
    lone surrogates or NUL are replaced."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to decode
        return safe_text(mask_text(text))
    if isinstance(parsed, str):
        return safe_text(json.dumps(mask_text(parsed), ensure_ascii=False))
    return safe_text(json.dumps(mask_value(parsed, sensitive), ensure_ascii=False))


def mask_any(value: Any, sensitive: Iterable[str] = SENSITIVE_FIELDS) -> Any:
    """`mask_json_text` for text, `mask_value` for anything else."""
    if isinstance(value, str):
        return mask_json_text(value, sensitive)
    return mask_value(value, sensitive)
