"""Masking of personal data wherever a value is written outside the
conversation and the world tables: the audit log, status events, logs,
spans, the turn's result.

It works on parsed values, not raw text: a JSON argument string is parsed
first, so `"ops\\u0040example.com"` is seen as the address it encodes. Every
string inside is masked (e-mail local parts, all but the last two digits of a
phone number), and the values of sensitive fields (`SENSITIVE_FIELDS`, or a
caller's own set) are replaced whole. Pure: safe in workflow code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from turnstile.engine.safe_text import safe_text

# Bounded repetitions (RFC 5321 caps a local part at 64 characters): an
# unbounded `[...]*@` backtracks quadratically over megabytes of text.
# An address is recognised however it is spelled: Unicode (and IDN) local
# parts and domains, a quoted local part, and the "@" and "." written as
# percent, HTML or JSON escapes or as their full-width and small forms.
_AT = r"(?:@|%40|&#0*64;|&#x0*40;|&commat;|\\u0040|\uff20|\ufe6b)"
_DOT = r"(?:\.|%2e|&#0*46;|&#x0*2e;|&period;|\uff0e|\u3002|\uff61)"
_LABEL = r"[\w-]{1,63}"
_EMAIL = re.compile(
    r"(\"[^\"\n]{1,64}\"|[\w.%+-](?:[\w.+-]|%(?!40)){0,63})" + _AT
    + r"(" + _LABEL + r"(?:" + _DOT + _LABEL + r"){0,8}" + _DOT + r"[^\W\d_]{2,24})",
    re.IGNORECASE)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")  # ISO dates look like numbers, not phones
_PHONE = re.compile(r"(?<![\w+])(\+?\d[\d\s().-]{6,20}\d)(?!\w)")
# What either pattern needs: text without it is left as it is.
_MAYBE = re.compile(r"[@\d\uff20\ufe6b]|%40|&#|&commat;|\\u0040", re.IGNORECASE)

SENSITIVE_FIELDS = frozenset({"password", "secret", "token", "api_key", "apikey",
                              "authorization", "phone", "phonenumber", "phone_number"})
MASKED = "***"


def mask_text(text: str) -> str:
    """Mask e-mail local parts and phone numbers in plain text."""
    if not _MAYBE.search(text):
        return text
    text = _EMAIL.sub(lambda m: f"{m.group(1).lstrip(chr(34))[:1]}***@{m.group(2)}", text)

    def phone(m: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", m.group(1))
        if len(digits) < 7 or _DATE.fullmatch(m.group(1)):
            return m.group(1)
        return "*" * (len(digits) - 2) + digits[-2:]

    return _PHONE.sub(phone, text)


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
