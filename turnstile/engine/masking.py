"""Masking of personal data wherever a value is written outside the
conversation and the world tables: the audit log, status events, logs,
spans, the turn's result (docs/masking.md states every rule, with its known
false positives and negatives).

It works on parsed values, not raw text: a JSON argument string is parsed
first and walked — object keys, strings and numbers; the values of sensitive
fields (`SENSITIVE_FIELDS`, or a caller's own set) and of fields named as
phone numbers are replaced whole. Pure: safe in workflow code (its data is
read when the module is imported).

- **E-mail addresses** are recognised however they are spelled: every run of
  text between spaces, quotes and brackets that holds an "@" or an escape
  (`\\u0040`, `\\x40`, `&#64` with or without `;`, `&commat;`, `%40`,
  `%2540`, `%u0040`, the full-width and small "@") is decoded layer after
  layer to a fixed point (at most `MAX_LAYERS`; a run still changing after
  them is masked whole), its invisible characters (Cf, default-ignorable:
  zero-width, bidi controls) dropped, normalised (NFC, then NFKC) and marks
  beside "@" and "." dropped; addresses are found in it with Unicode letters,
  marks and digits in both parts, any RFC 5322 punctuation in the local part,
  and IP-literal domains (`user@[10.0.0.1]`). Only a run holding an address
  is rewritten: decoded, its local parts masked — to their first character
  (`a***@example.com`), or whole when quoted or punctuated beyond `. _ + -`
  (`o'connor`, `tom&jerry`, SRS addresses `SRS0=h=tt=domain=local@fwd`).
- **Phone numbers** are found by Google's libphonenumber (`phonenumbers`'s
  `PhoneNumberMatcher`, Leniency.VALID): numbers valid for their country,
  written with a `+` or `00` country code, or for `PHONE_REGION` without one,
  with invisible characters between their digits or written with escapes. A
  number glued into an id (`demo-4155552671`) is part of the id and left
  alone. All but the last two digits are masked. Timestamps, durations,
  counts and ids are not phone numbers, and stay as written.
- **Numbers in parsed values** (`mask_value`): an integer is a phone number
  when its field is named as one (`mobile`, `phone`, `tel`, `fax`, ...:
  masked whole), or, in any field not named as an id, count, time or amount,
  when it has 11 to 15 digits and reads as a valid number with its country
  code (`14155552671`, `442079460958`). No epoch timestamp in seconds,
  milliseconds or finer between 2001-09-09 and 2033-05-18 reads so.
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
# numbers; every other country's numbers are found when written with "+" or "00".
PHONE_REGION = "US"

# libphonenumber loads each region's metadata on first use, by importing a
# module. Inside workflow code (a preview masked in the turn's state) that
# import would run in Temporal's sandbox, which refuses phonenumbers' module
# lock: load every region now, when this module is imported (passed through,
# once per worker), so masking never imports anything during a turn.
phonenumbers.PhoneMetadata.load_all()

# Escape layers decoded in a run (one layer: every kind of escape decoded
# once); a run that still changes after them is masked whole.
MAX_LAYERS = 16

# A run of text that may hold an address: up to space, double quotes, angle
# brackets, parentheses and commas (none of them is in an unquoted address).
_RUN = re.compile(r"[^\s\"<>(),]{3,}")
# What a run holding an escaped or spelled "@" holds (others are left as they
# are). U+FF20 and U+FE6B are the only characters NFKC makes an "@".
_AT_MARKS = ("@", "%", "&", "\\", "\uff20", "\ufe6b")
_ANY_AT_MARK = re.compile("[" + re.escape("".join(_AT_MARKS)) + "]")

# Invisible characters: format characters (Cf: zero-width space and joiners,
# the bidi controls, soft hyphen, word joiner, BOM) and default-ignorable code
# points (variation selectors, the combining grapheme joiner, Hangul fillers).
_INVISIBLE = regex.compile(r"[\p{Cf}\p{DI}]")
# Nonspacing marks beside "@" and "." (nothing they could combine with).
_MARK_BESIDE = regex.compile(r"\p{Mn}+(?=[@.])|(?<=[@.])\p{Mn}+")
# Right-to-left override: what follows (to a pop or the line's end) shows reversed.
_OVERRIDDEN = re.compile("\u202e[^\n]*")
_POPS = "\u202c\u2069"  # where an override may end (pop directional formatting or isolate)

# The local part: RFC 5322's atext and dots, in any script, bounded (RFC 5321
# caps it at 64 characters; an unbounded `[...]*@` backtracks quadratically
# over megabytes of text). A leading quote, brace, bar or backtick is read as
# text around the address, not as its first character.
_LOCAL = (r"[\p{L}\p{M}\p{N}_%+\-!#$&*/=?^~]"
          r"[\p{L}\p{M}\p{N}_%+\-!#$&*/=?^~.'{|}`]{0,63}")
_LABEL = r"[\p{L}\p{M}\p{N}_-]{1,63}"
_DOMAIN = (r"\[(?:IPv6:)?[0-9A-Za-z:.]{2,45}\]"  # an address literal
           r"|\d{1,3}(?:\.\d{1,3}){3}(?![\d.])"  # an IPv4 address, unbracketed
           r"|" + _LABEL + r"(?:\." + _LABEL + r"){0,8}\.[\p{L}\p{M}]{2,24}")
_EMAIL = regex.compile(r"(\"[^\"\n]{1,64}\"|" + _LOCAL + r")@(" + _DOMAIN + ")",
                       regex.IGNORECASE)
# A local part with more than letters, marks, digits and ". _ + -" is masked whole.
_PUNCTUATED = regex.compile(r"[^\p{L}\p{M}\p{N}._+\-]")

_U_ESCAPE = re.compile(r"\\+u([0-9a-fA-F]{4})")
_OTHER_ESCAPE = re.compile(r"\\+(?:x([0-9a-fA-F]{2})|u\{([0-9a-fA-F]{1,6})\}|U([0-9a-fA-F]{8}))")
_PCT_U = re.compile(r"%u([0-9a-fA-F]{4})")
# A numeric reference without ";" whose first digits are "@" or "." and more
# digits follow: read as "@"/"." (HTML would read `&#x40c` as U+040C).
_BARE_AT = re.compile(r"&#(?:[xX]0*(40|2[eE])(?=[0-9a-fA-F]+(?![0-9a-fA-F;]))"
                      r"|0*(64|46)(?=\d+(?![\d;])))")
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
# "00" as an international prefix (0044 20 7946 0958, 00 44 ...): read as "+",
# after a space, an opening bracket or quote, "=", ":" or "," or at the start.
_IDD = re.compile(r"(?<![^\s(\[\"'=:,])00[ .\-]?(?=[1-9])")
# A field named as a phone number, then a number, in text: `"mobile": 447911123456`,
# `fax=0044...` (the field decides, as in parsed values).
_FIELD_NUMBER = re.compile(r"(?<![A-Za-z0-9_\-])([A-Za-z][A-Za-z0-9_\-]{1,40})"
                           r"[\"']?\s{0,3}[:=]\s{0,3}[\"']?"
                           r"(\+?\d(?:[\s().\-]{0,2}\d){6,16})(?!\d)")

SENSITIVE_FIELDS = frozenset({"password", "secret", "token", "api_key", "apikey",
                              "authorization", "phone", "phonenumber", "phone_number"})
MASKED = "***"

# Field names, split into words (snake_case, camelCase, kebab-case, spaces).
# A field is named as a phone number when a word is one of PHONE_WORDS (or
# holds one of the longer ones: "cellphone", "mobilenumber") and none is one
# of NOT_PHONE_WORDS; it is named as an id, count, time or amount when a word
# is one of NOT_PHONE_WORDS.
PHONE_WORDS = frozenset({"phone", "phones", "telephone", "tel", "telno", "mobile", "mobiles",
                         "cell", "cellphone", "fax", "msisdn", "whatsapp", "sms", "landline"})
_PHONE_PARTS = ("phone", "mobile", "msisdn", "whatsapp", "landline")
NOT_PHONE_WORDS = frozenset({
    "id", "ids", "uid", "uuid", "guid", "pk", "key", "ref", "seq", "sequence", "serial",
    "idx", "index", "offset", "limit", "page", "count", "counts", "total", "qty",
    "quantity", "amount", "amounts", "price", "cost", "cents", "balance", "sum", "size",
    "bytes", "length", "len", "ts", "time", "timestamp", "date", "epoch", "ms",
    "millis", "micros", "nanos", "seconds", "secs", "duration", "elapsed", "version",
    "port", "year", "created", "updated", "modified", "expires", "deadline", "tokens",
    "hash", "nonce"})
# A cheap first look for a field named as a phone number in text (substrings).
_PHONE_STEMS = ("phone", "mobile", "tel", "fax", "cell", "msisdn", "whatsapp", "sms", "landline")
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def decoded(text: str) -> str:
    """`text` with its escape layers decoded — JSON `\\u` and other
    backslash escapes, HTML entities (with or without `;`), percent-encoding
    — at most `MAX_LAYERS` (the rest stays encoded), invisible characters
    dropped and normalised (NFC, NFKC; the ideographic full stops are dots)."""
    layers = _decoded_layers(text)
    return _plain(text if layers is None else layers)


def _decoded_layers(text: str) -> str | None:
    """`text` decoded to a fixed point, or None when it still changes after
    MAX_LAYERS layers."""
    for _ in range(MAX_LAYERS + 1):
        before = text
        text = _U_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
        text = _OTHER_ESCAPE.sub(_escaped_char, text)
        text = _BARE_AT.sub(lambda m: "@" if (m.group(1) or m.group(2)) in ("40", "64")
                            else ".", text)
        text = html.unescape(text)
        text = _PCT_U.sub(lambda m: chr(int(m.group(1), 16)), text)
        text = unquote(text, errors="replace")
        if text == before:
            return text
    return None


def _escaped_char(m: re.Match[str]) -> str:
    code = int(m.group(1) or m.group(2) or m.group(3), 16)
    return chr(code) if code <= 0x10FFFF else m.group()


def _plain(text: str) -> str:
    """Decoded text as the address matcher reads it: no invisible characters,
    NFC then NFKC, ideographic full stops as dots, no marks beside "@" and "."."""
    text = str(_INVISIBLE.sub("", text))
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFC", text)).translate(_DOTS)
    return str(_MARK_BESIDE.sub("", text))


def _masked_address(m: regex.Match[str]) -> str:
    local, domain = str(m.group(1)), str(m.group(2))
    if local == MASKED or (len(local) == len(MASKED) + 1 and local.endswith(MASKED)):
        return str(m.group())  # masked already: masking twice changes nothing
    if local.startswith('"') or _PUNCTUATED.search(local):
        return f"{MASKED}@{domain}"  # quoted, punctuated, SRS: no prefix kept
    return f"{local[:1]}{MASKED}@{domain}"


def _reversed_address(text: str) -> bool:
    """Whether a right-to-left override in `text` shows an address: the
    override's span (to each pop, or the line's end) read in the order it is shown."""
    for span in _OVERRIDDEN.finditer(text):
        shown = span.group()
        ends = [i for i, ch in enumerate(shown) if ch in _POPS] + [len(shown)]
        for end in ends:
            layers = _decoded_layers(shown[:end][::-1])
            if layers is None or _EMAIL.search(_plain(layers)):  # over the bound: masked
                return True
    return False


def _mask_overrides(text: str) -> str:
    """What follows a right-to-left override that shows an address, to the
    line's end: masked whole."""
    if "\u202e" not in text or not _reversed_address(text):
        return text
    return _OVERRIDDEN.sub(lambda s: MASKED if _reversed_address(s.group()) else s.group(), text)


def _mask_addresses(text: str) -> str:
    if not _ANY_AT_MARK.search(text):  # no run of it can hold one
        return text
    out: list[str] = []
    done = 0  # text[:done] is written
    for run in _RUN.finditer(text):
        start, end = run.span()
        if start < done or not _ANY_AT_MARK.search(run.group()):
            continue
        layers = _decoded_layers(run.group())
        if layers is None:  # more escape layers than any writer needs: masked whole,
            if start > done and text[start - 1] == '"':  # with a quoted part before it
                opening = text.rfind('"', max(done, start - 66), start - 1)
                start = opening if opening >= 0 else start
            out += [text[done:start], MASKED]
            done = end
            continue
        plain = _plain(layers)
        if plain.startswith("@") and start > done and text[start - 1] == '"':
            opening = text.rfind('"', max(done, start - 66), start - 1)
            if opening >= 0:  # a quoted local part: "name"@example.com
                start, plain = opening, decoded(text[opening:end])
        if "\u202e" in layers and _reversed_address(layers):
            masked = MASKED  # an escaped override showing an address
        else:
            masked = _EMAIL.sub(_masked_address, plain) if "@" in plain else plain
        if masked == plain and plain != run.group() and _MAYBE_PHONE.search(plain):
            masked = _mask_phones(plain)  # a phone number written with escapes
        if masked != plain:
            out += [text[done:start], masked]
            done = end
    return "".join(out) + text[done:] if out else text


def _visible(text: str) -> tuple[str, list[int] | None]:
    """`text` without its invisible characters, and where each character of
    it is in `text` (None: nothing was dropped)."""
    if not _INVISIBLE.search(text):
        return text, None
    where = [i for i, ch in enumerate(text) if not _INVISIBLE.match(ch)]
    return "".join(text[i] for i in where), where


def _mask_phones(text: str, international_only: bool = False) -> str:
    """Phone numbers in `text` masked (`international_only`: those written
    with a country code, "+" or "00")."""
    view, where = _visible(text)
    if not _MAYBE_PHONE.search(view) or not _MAYBE_PHONE.search(
            _UUIDS.sub(" ", _TIMES.sub(" ", view))):
        return text
    # The matcher reads the text with its dates and times blanked out and
    # "00" prefixes as "+" (same length: what it finds is masked at the same place).
    scan = _TIMES.sub(lambda t: _BLANK * len(t.group()), view)
    prefix_at: dict[int, int] = {}  # where a "00" prefix's "+" is -> where the prefix starts
    for idd in _IDD.finditer(scan):
        prefix_at[idd.end() - 1] = idd.start()
    if prefix_at:
        scan = _IDD.sub(lambda m: " " * (len(m.group()) - 1) + "+", scan)
    spans: list[tuple[int, int, str]] = []
    for found in phonenumbers.PhoneNumberMatcher(scan, PHONE_REGION,
                                                 leniency=phonenumbers.Leniency.VALID):
        start, end = found.start, found.end
        start = prefix_at.get(start, start)
        before = scan[start - 2:start] if start >= 2 else scan[:start]
        after = scan[end:end + 2]
        if _glued(before[::-1]) or _glued(after):
            continue  # digits of an id (demo-4155552671), not a phone number
        if international_only and not found.raw_string.startswith("+"):
            continue
        spans.append((start, end, _masked_digits(found.raw_string)))
    lowered = "" if international_only else scan.lower()
    named = any(stem in lowered for stem in _PHONE_STEMS)
    for field in _FIELD_NUMBER.finditer(scan) if named else ():
        start, end = field.span(2)
        if _phone_field(field.group(1)) and not any(s < end and start < e for s, e, _ in spans):
            spans.append((start, end, _masked_digits(field.group(2))))
    if not spans:
        return text
    out: list[str] = []
    done = 0
    for start, end, masked in sorted(spans):
        if where is not None:
            start, end = where[start], where[end - 1] + 1
        out += [text[done:start], masked]
        done = end
    return "".join(out) + text[done:]


def _masked_digits(number: str) -> str:
    digits = [ch for ch in number if ch.isdigit()]
    return "*" * (len(digits) - 2) + "".join(digits[-2:])


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
    return _mask_phones(_mask_addresses(_mask_overrides(text)))


# A cut text's tail: the run the cut went through, and the digits and phone
# punctuation before it (a number cut in half is no number to the matcher).
_CUT_TAIL = re.compile(r"[\d\s().+\-/]*[^\s\"<>(),]*\Z")


def mask_prefix(text: str, chars: int) -> str:
    """At most `chars` characters of `text`, masked, for a preview: the text
    is cut first (the rest is never read) and the run the cut went through is
    dropped, so an address or number cut in half is not left unmasked."""
    if len(text) > chars:
        text = _CUT_TAIL.sub("", text[:chars])
    return mask_text(text)


# Short texts recur: the values of a tool result's rows (names, addresses,
# dates) in every call and turn that reads them, the run and workflow ids on
# every log line and span of a turn. Their masked form is remembered (pure, so
# the same either way; bounded: at most 4,096 texts of <= 256 characters).
_REMEMBERED_CHARS = 256


@functools.lru_cache(maxsize=4096)
def _mask_short(text: str) -> str:
    return _mask_phones(_mask_addresses(_mask_overrides(text)))


# --- numbers and field names in parsed values ----------------------------------


@functools.lru_cache(maxsize=1024)
def _field_words(name: str) -> frozenset[str]:
    return frozenset(w.lower() for w in _WORDS.findall(name))


def _phone_field(name: str) -> bool:
    """Whether a field's name says it holds a phone number (docs/masking.md)."""
    words = _field_words(name)
    if words & NOT_PHONE_WORDS:
        return False
    return bool(words & PHONE_WORDS) or any(part in w for w in words for part in _PHONE_PARTS)


def _not_phone_field(name: str | None) -> bool:
    """Whether a field's name says it holds an id, a count, a time or an amount."""
    return name is not None and bool(_field_words(name) & NOT_PHONE_WORDS)


@functools.lru_cache(maxsize=4096)
def _e164(number: int) -> bool:
    """Whether an integer of 11 to 15 digits reads as a valid phone number
    with its country code (`14155552671`: +1 415 555 2671)."""
    digits = str(number)
    if not 11 <= len(digits) <= 15:
        return False
    try:
        return phonenumbers.is_valid_number(phonenumbers.parse("+" + digits, None))
    except phonenumbers.NumberParseException:
        return False


def mask_number(value: int, field: str | None = None) -> int | str:
    """An integer as parsed values are masked: a phone number's digits but
    the last two masked (a string then), anything else as it is. `field`: the
    name of the field holding it (a list's items: the list's field)."""
    if value <= 0 or _not_phone_field(field) or not _e164(value):
        return value
    return _masked_digits(str(value))


def mask_value(value: Any, sensitive: Iterable[str] = SENSITIVE_FIELDS) -> Any:
    """A copy of a parsed JSON-like value with every key and string masked,
    integers that are phone numbers masked (`mask_number`), and the values of
    sensitive keys and of keys named as phone numbers replaced."""
    keys = {k.lower() for k in sensitive}

    def walk(v: Any, depth: int, field: str | None) -> Any:
        if isinstance(v, str):
            nested = _json_in(v) if depth < MAX_NESTED_JSON else None
            if nested is not None:  # JSON inside a string: masked value by value
                return json.dumps(walk(nested, depth + 1, field), ensure_ascii=False)
            if _not_phone_field(field):  # an id, count, time or amount: numbers with
                # a country code only (docs/masking.md)
                return _mask_phones(_mask_addresses(_mask_overrides(v)), international_only=True)
            return mask_text(v)
        if isinstance(v, bool) or v is None:
            return v
        if isinstance(v, int):
            return mask_number(v, field)
        if isinstance(v, dict):
            out: dict[Any, Any] = {}
            for k, x in v.items():
                name = k if isinstance(k, str) else None
                hidden = name is not None and (name.lower() in keys or _phone_field(name))
                out[_unique(out, _masked_key(k))] = MASKED if hidden else walk(x, depth, name)
            return out
        if isinstance(v, (list, tuple)):
            return [walk(x, depth, field) for x in v]
        return v

    return walk(value, 0, None)


def _masked_key(key: Any) -> Any:
    if isinstance(key, str):
        return mask_text(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return mask_number(key)
    return key


def _unique(out: dict[Any, Any], key: Any) -> Any:
    """`key`, or `key#2`, `key#3`, ... when masking made two keys one
    (`alice@x.com` and `adam@x.com` are both `a***@x.com`)."""
    if key not in out:
        return key
    n = 2
    while f"{key}#{n}" in out:
        n += 1
    return f"{key}#{n}"


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
