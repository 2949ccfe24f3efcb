"""Generated personal data in every form docs/masking.md names, and what must
stay as written, for the masking properties (tests/test_masking_property.py,
tests/test_masking_turn_property.py, bench/masking_properties.py).

Each generated address or number comes with the text that must not be found
in a sink afterwards: an address's seeds (random tokens of its local part,
each but its first character: a mask keeps at most that), a phone number's
digits but the last two (a mask keeps those). Encoders never encode a
seed's letters, so a form left unmasked shows its seed as written.
"""

from __future__ import annotations

import json
import re
import unicodedata
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import phonenumbers
from hypothesis import strategies as st

from turnstile.engine.masking import MAX_LAYERS

# Zero-width, joiners, bidi marks, embeddings, overrides and isolates, word
# joiner, BOM, soft hyphen, combining grapheme joiner, variation selector.
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u202a", "\u202b", "\u202c",
             "\u202d", "\u2066", "\u2067", "\u2068", "\u2069", "\u2060", "\ufeff", "\u00ad",
             "\u034f", "\ufe0f", "\u061c"]
MARKS = ["\u0301", "\u0338", "\u0308"]  # nonspacing marks
PUNCT = list("!#$%&'*/=?^{|}~`")  # RFC 5322 atext beyond letters, digits, . _ + -
AT_SPELLINGS = ["@", "\\u0040", "\\x40", "\\u{40}", "&#64;", "&#x40;", "&#X40;", "&commat;",
                "%40", "%u0040", "\uff20", "\ufe6b"]
DOT_SPELLINGS = [".", "\\u002e", "&#46;", "&#x2e;", "&period;", "%2E", "\uff0e", "\u3002"]
DOMAINS = ["example.com", "mail.example.org", "b\u00fccher.de", "ex\u0430mple.com",
           "\u0909\u0926\u093e\u0939\u0930\u0923.\u092d\u093e\u0930\u0924",
           "[10.0.0.1]", "[192.168.17.4]", "[IPv6:2001:db8::1]", "[IPv6:fe80::2]", "10.1.2.3",
           "abc.example.com", "fed.example.net"]  # hex-letter starts: `&#x40abc` reads "@abc"
REGIONS = ["US", "GB", "DE", "FR", "IN", "BR", "JP", "AU", "ZA", "MX", "ES", "IT", "NL", "CH"]


@dataclass
class Form:
    """One generated value and what must not be found once it is masked."""

    text: str
    hidden: list[str] = field(default_factory=list)  # seeds of addresses, as written
    digits: list[str] = field(default_factory=list)  # phone digits but the last two
    kind: str = ""


seeds = st.text("bcdfghjkmnpqrstvwxz", min_size=5, max_size=8).map(lambda s: "zq" + s)


@st.composite
def addresses(draw: st.DrawFn) -> Form:
    """An address in one of the forms docs/masking.md lists, or the forms of
    the review's gaps: punctuated and SRS local parts, invisible characters and marks
    beside "@" and ".", `&#x40` before a hex letter, IP-literal domains, and
    up to MAX_LAYERS + 3 escape layers."""
    first = draw(seeds)
    kind = draw(st.sampled_from(["plain", "punctuated", "srs", "quoted", "nfd", "indic"]))
    hidden = [first]
    if kind == "punctuated":
        second = draw(seeds)
        hidden.append(second)
        local = first + draw(st.sampled_from(PUNCT)) + second
    elif kind == "srs":
        second = draw(seeds)
        hidden.append(second)
        local = f"SRS0=HH{first[2:5]}=TT=example.org={second}"
    elif kind == "quoted":
        local = f'"{first} x"'
    elif kind == "nfd":
        local = first + "e\u0301"
    elif kind == "indic":
        local = first + "\u0930\u093e\u092e"
    else:
        local = first
    domain = draw(st.sampled_from(DOMAINS))
    at = draw(st.sampled_from(AT_SPELLINGS))
    if at in ("&#x40", "&#64") or draw(st.booleans()) and at.startswith("&#"):
        at = at.rstrip(";")  # an entity without ";" (before a hex letter or digit too)
    if domain[0] != "[" and draw(st.booleans()):  # a spelled "." in the domain
        dot = draw(st.sampled_from(DOT_SPELLINGS))
        domain = domain.replace(".", dot, 1)
    around = draw(st.lists(st.sampled_from(INVISIBLE + MARKS), max_size=3))
    before_at = "".join(c for c in around if c not in MARKS) if at != "@" else "".join(around)
    after_at = draw(st.sampled_from(["", *INVISIBLE]))
    text = f"{local}{before_at}{at}{after_at}{domain}"
    layers = draw(st.integers(0, MAX_LAYERS + 3))
    # Mixed layers multiply the escapes (HTML's "&#37;" is three more for
    # percent-encoding): up to six are mixed, more are of one kind.
    one_kind = draw(st.sampled_from(ENCODERS[:1] + ENCODERS[2:])) if layers > 6 else None
    for _ in range(layers):
        text = (one_kind or draw(st.sampled_from(ENCODERS)))(text)
    if draw(st.integers(0, 9)) == 0:  # shown reversed behind a right-to-left override
        text = "\u202e" + text[::-1]
        hidden = [h[::-1] for h in hidden]
    return Form(text, hidden=[h[1:] for h in hidden], kind=f"{kind}/{layers} layers")


def _percent(text: str) -> str:
    """One percent-encoding layer of everything but letters and digits."""
    return quote(text, safe="")


def _html(text: str) -> str:
    """One HTML layer: "&" as `&amp;`, "@", "." and "%" as numeric references
    (each layer adds a few characters: a run of many layers stays small)."""
    return re.sub(r"[@.%]", lambda m: f"&#{ord(m.group())};", text.replace("&", "&amp;"))


def _json_escape(text: str) -> str:
    r"""One JSON-escape layer: "\\", "@" and "." as \uXXXX."""
    return re.sub(r"[\\@.]", lambda m: f"\\u{ord(m.group()):04x}", text)


ENCODERS = [_percent, _html, _json_escape]


def _valid_numbers(region: str) -> st.SearchStrategy[phonenumbers.PhoneNumber]:
    example = phonenumbers.example_number_for_type(region, phonenumbers.PhoneNumberType.MOBILE) \
        or phonenumbers.example_number(region)
    assert example is not None
    national = str(example.national_number)

    def varied(tail: str) -> phonenumbers.PhoneNumber:
        n = phonenumbers.PhoneNumber(country_code=example.country_code,
                                     national_number=int(national[:-len(tail)] + tail))
        return n

    return st.text("0123456789", min_size=3, max_size=3).map(varied).filter(
        phonenumbers.is_valid_number)


numbers = st.sampled_from(REGIONS).flatmap(_valid_numbers)


@st.composite
def phones(draw: st.DrawFn) -> Form:
    """A valid phone number written as text: E.164 with "+", international
    format, "00" and "00 " prefixes, NANP numbers without a country code,
    `tel:` URIs, with invisible characters between digit groups, or
    percent-encoded."""
    number = draw(numbers)
    e164 = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    intl = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.INTERNATIONAL)
    forms = [e164, intl, "00" + intl[1:], "00 " + intl[1:], "tel:" + e164]
    if number.country_code == 1:
        forms.append(phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL))
    text = draw(st.sampled_from(forms))
    how = draw(st.sampled_from(["as written", "invisible", "percent"]))
    if how == "invisible":
        text = text.replace(" ", draw(st.sampled_from(INVISIBLE[:4])) + " ", 1)
        text = re.sub(r"(\d)(\d)$", lambda m: m.group(1) + "\u200b" + m.group(2), text)
    elif how == "percent":
        text = quote(text, safe="")
    digits = str(number.country_code) + str(number.national_number)
    return Form(text, digits=[digits[:-2], str(number.national_number)[:-2]], kind=how)


PHONE_FIELDS = ["mobile", "phone", "cellPhone", "fax", "tel", "whatsapp_number", "msisdn",
                "contactPhone", "home-phone", "MOBILE"]
NEUTRAL_FIELDS = ["n", "value", "contact", "reach", "x", "data"]


@st.composite
def integer_phones(draw: st.DrawFn) -> tuple[str | None, int, Form]:
    """A phone number as an integer with its country code, in a field named as
    a phone number or a neutral one (None: a list item)."""
    number = draw(numbers)
    digits = str(number.country_code) + str(number.national_number)
    name = draw(st.sampled_from([*PHONE_FIELDS, *NEUTRAL_FIELDS, None]))
    return name, int(digits), Form(digits, digits=[digits[:-2]], kind="integer")


# --- what must stay as written ---------------------------------------------------

ID_FIELDS = ["id", "order_id", "customerId", "invoiceID", "seq", "ref", "uid", "pk"]
TIME_FIELDS = ["created_at", "ts", "timestamp", "updatedAt", "epoch_ms", "time", "sent_at"]
COUNT_FIELDS = ["count", "total", "qty", "amount", "price_cents", "size", "balance"]
# Epoch timestamps whose digits never read as a phone number (docs/masking.md).
EPOCH_FROM, EPOCH_TO = 1_000_000_000, 2_000_000_000  # 2001-09-09 .. 2033-05-18


@st.composite
def kept_values(draw: st.DrawFn) -> dict[str, Any]:
    """Ids, timestamps, counts, UUIDs and amounts, as tools write them: none
    may be changed by masking."""
    out: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(ID_FIELDS), min_size=1, max_size=3, unique=True)):
        out[name] = draw(st.integers(0, 10**18) | st.integers(10**10, 10**15)
                         | st.text("0123456789", min_size=7, max_size=15))
    out["ids"] = draw(st.lists(st.integers(10**9, 10**15), max_size=3))
    for name in draw(st.lists(st.sampled_from(TIME_FIELDS), min_size=1, max_size=2, unique=True)):
        out[name] = draw(epochs)
    # neutral fields: timestamps in the window above, counts of up to 10 digits
    out["t"] = draw(epochs)
    out["n"] = draw(st.integers(0, 9_999_999_999))
    for name in draw(st.lists(st.sampled_from(COUNT_FIELDS), min_size=1, max_size=2, unique=True)):
        out[name] = draw(st.integers(0, 10**15) | st.floats(0, 1e12, allow_nan=False))
    out["uuid"] = str(draw(st.uuids()))
    out["run"] = draw(st.uuids()).hex
    out["when"] = draw(st.datetimes(datetime(2000, 1, 1), datetime(2099, 12, 31),
                                    timezones=st.just(UTC))).isoformat()
    out["label"] = "demo-" + str(draw(st.integers(10**9, 10**12)))
    out["amount_text"] = f"{draw(st.integers(0, 10**9)):,}.{draw(st.integers(0, 99)):02d} USD"
    return out


epochs = st.integers(EPOCH_FROM, EPOCH_TO - 1).flatmap(
    lambda s: st.sampled_from([s, s * 1000, s * 1_000_000, s * 1_000_000_000]))


# --- searching a sink ----------------------------------------------------------------

_U = re.compile(r"\\+u([0-9a-fA-F]{4})")
_INVISIBLE_RE = re.compile("[" + "".join(INVISIBLE) + "]")


def readable(text: str) -> str:
    """A sink's text as a person reads it: JSON `\\u` escapes decoded,
    invisible characters dropped, NFKC."""
    text = _U.sub(lambda m: chr(int(m.group(1), 16)), text)
    text = _INVISIBLE_RE.sub("", text)
    return unicodedata.normalize("NFKC", text)


def _digits_pattern(digits: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\d)" + r"[\s().\-/+]{0,3}".join(digits))


def leaks(sinks: dict[str, str], forms: list[Form]) -> list[tuple[str, str, str]]:
    """(sink, form, what was found) for every seed or phone digits found."""
    found = []
    for sink, text in sinks.items():
        plain = readable(text)
        lowered = plain.lower()
        for form in forms:
            for seed in form.hidden:
                if seed in text or seed.lower() in lowered:
                    found.append((sink, form.text, seed))
            for digits in form.digits:
                if _digits_pattern(digits).search(plain):
                    found.append((sink, form.text, digits))
    return found


def unique_id() -> str:
    return uuid.uuid4().hex[:8]


def joined(forms: list[Form]) -> str:
    """Forms in one text, as a message or note holds them."""
    return " ; ".join(f.text for f in forms)


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
