"""Where an argument's values came from: matching a call's sensitive
arguments against the labelled texts of its conversation
(docs/information-flow.md says what this finds and what it misses).

Each source is a text with a label: the user's messages and the service's
system prompt are trusted; tool results, MCP answers and retrieved
documents are not (unless the tool declares `trusted_results`). For each
argument the values are walked (strings and numbers, nested lists and
objects bounded), and from each string the *needles* are taken: the whole
value, and the sub-values that carry meaning on their own — e-mail
addresses, URLs, domains and other identifier-like tokens, IBAN-like ids,
runs of digits. A needle is looked for in every source after the same
normalisation on both sides (NFKC, case fold, UTS #39 confusable skeleton,
whitespace collapsed), and as an exact case-folded copy; at word
boundaries, so `bob` is not found in `bobby`.

A needle found in a trusted source is the user's, wherever else it
appears; found only in untrusted sources, the argument is untrusted and
its provenance lists those sources, in conversation order.

Some sources are not texts but *whole values*, trusted: those a tool
vouches for (`@tool(trusted_values=...)`, kind `value`) and those in the
arguments of a call a person approved (kind `approval`). A needle is found
in them only when it EQUALS one (NFKC, case folded, whitespace collapsed;
the exact case-folded copy; IBANs without spaces; numbers by value; not
the confusable skeleton: a look-alike is another value) — never inside
one, so the text inside a vouched value (a channel named
"External_<an injected URL>") vouches for nothing.
An argument's leaf equal to such a value is trusted whole: its own
sub-values are not looked for elsewhere.

Pure and bounded: every loop has a cap (sources, bytes, needles, leaves,
occurrences), every pattern runs in linear time. Run in the `review_call`
activity, whose result records it in the turn's history.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any

from turnstile.engine.flow import (
    FlowRule,
    FlowVerdict,
    Provenance,
    ProvenanceSource,
    SourceKind,
    verdict as flow_verdict,
)
from turnstile.engine.identity import prepared, skeleton
from turnstile.engine.masking import mask_text

MAX_SOURCE_CHARS = 2_000_000  # of all sources together, newest kept
MAX_LEAVES = 200  # strings and numbers walked per argument
MAX_DEPTH = 6
MAX_NEEDLES = 60  # per argument
MAX_OCCURRENCES = 64  # a needle's occurrences tried for a word boundary, per source
MAX_SOURCES_SHOWN = 10  # per argument
MAX_VALUES = 20_000  # whole values of `value`/`approval` sources, newest kept
MAX_VALUE_CHARS = 1_000  # a longer value is not a whole value anyone vouches for
MIN_WHOLE = 3  # a whole value shorter than this is not looked for (a yes, an id 7)
MIN_TOKEN = 6  # an identifier-like token
MIN_DIGITS = 3  # a number or run of digits
EXCERPT = 200
VALUE = 80

_EMAIL = re.compile(r"[^\s@<>()\[\]{},;:\"'`]{1,64}@[^\s@<>()\[\]{},;:\"'`]{1,255}")
# Runs of characters that make up ids, addresses, URLs and paths.
_TOKEN = re.compile(r"[\w@.\-/+:%?=&#~]+")
_IBAN = re.compile(r"[a-z]{2}\d{2}[a-z0-9]{11,30}")
_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")
# A thousands separator: between digits, before a group of exactly three.
_SEPARATOR_IN_NUMBER = re.compile(r"(?<=\d)[,\s_'’](?=\d{3}(?!\d))")
_EDGE = ".,:;!?'\"()[]{}<>"


@dataclass(frozen=True)
class LabelledSource:
    """A text the model read, with where it came from."""

    kind: SourceKind
    trusted: bool
    text: str
    tool_name: str = ""
    tool_call_id: str = ""
    title: str = ""
    # kind `value` / `approval`: the whole values, each with the key (result
    # field, or argument) it was under; `text` is then "".
    values: tuple[tuple[str, str | int | float], ...] = ()
    # A result's copies of its own call's arguments (their needles' plain
    # forms): the result is not where those values came from — a tool that
    # answers {"lent": "B-1", "to": "m-1"} does not make m-1 untrusted. The
    # values' origin, if any, is found where the model read them.
    echoes: frozenset[str] = frozenset()


def echoes_of(arguments: Any) -> frozenset[str]:
    """The plain forms of the needles of a call's arguments."""
    return frozenset(n.plain for n in needles(arguments))


def plain(text: str) -> str:
    """NFKC, case-folded, invisible characters dropped, whitespace one space."""
    return prepared(unicodedata.normalize("NFKC", text).casefold())


def flat(text: str) -> str:
    """`plain`, then confusables to their prototypes (UTS #39 skeleton): a
    Cyrillic "о" in an address is the Latin "o" (digits become letters too:
    numbers are compared in their plain form)."""
    return skeleton(plain(text)).casefold()


@dataclass
class _Prepared:
    source: LabelledSource
    raw: str  # case-folded as written
    plain: str
    compact: str  # plain without whitespace (IBANs written in groups)
    numbers: str  # plain with separators between digits removed (1,500 -> 1500)

    @classmethod
    def of(cls, s: LabelledSource) -> _Prepared:
        p = plain(s.text)
        return cls(source=s, raw=s.text.casefold(), plain=p,
                   compact="".join(p.split()), numbers=_SEPARATOR_IN_NUMBER.sub("", p))

    @cached_property
    def flat(self) -> str:
        """The skeleton, made when first needed (most sources are ASCII, and
        between two ASCII texts the skeleton is not asked: `_find`)."""
        return flat(self.plain)

    @cached_property
    def ascii(self) -> bool:
        return self.plain.isascii()


def _number_form(text: str) -> str | None:
    """A number written alone ("1,500.00", "1500") as digits, no thousands
    separators, no trailing zeros of a fraction ("1500"); None otherwise."""
    m = _PLAIN_NUMBER.fullmatch(_SEPARATOR_IN_NUMBER.sub("", text))
    if m is None:
        return None
    fraction = (m.group(2) or "").rstrip("0")
    return m.group(1) + ("." + fraction if fraction else "")


_PLAIN_NUMBER = re.compile(r"(\d+)(?:\.(\d+))?")


@dataclass
class _Values:
    """A source of whole values, indexed by each normal form of each value."""

    source: LabelledSource
    by_plain: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> (key, as written)
    by_raw: dict[str, tuple[str, str]] = field(default_factory=dict)
    by_compact: dict[str, tuple[str, str]] = field(default_factory=dict)
    by_number: dict[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, s: LabelledSource) -> _Values:
        v = cls(source=s)
        for key, value in s.values:
            written = value if isinstance(value, str) else next(
                (n.plain for n in _number_needles(value)), str(value))
            written = written.strip()
            if not written or len(written) > MAX_VALUE_CHARS:
                continue
            p = plain(written)
            entry = (key, written)
            v.by_plain.setdefault(p, entry)
            v.by_raw.setdefault(written.casefold(), entry)
            v.by_compact.setdefault("".join(p.split()), entry)
            number = _number_form(p)
            if number is not None:
                v.by_number.setdefault(number, entry)
        return v

    def find(self, n: Needle) -> _Hit | None:
        """The value the needle EQUALS, if any (never one it is inside). Not
        by the skeleton: a look-alike of a vouched value ("bob@cоrp.example"
        with a Cyrillic "о") is another value, which the tool did not list;
        it is found in the result's text instead, untrusted."""
        if n.kind == "number":
            number = _number_form(n.plain)
            entry = self.by_number.get(number) if number is not None else None
        elif n.kind == "compact":
            entry = self.by_compact.get(n.plain)
        else:
            entry = self.by_plain.get(n.plain)
            if entry is None and n.raw:
                entry = self.by_raw.get(n.raw)
        if entry is None:
            return None
        key, written = entry
        return _Hit(self, 0, written, len(written), key=key)

    def __len__(self) -> int:
        return len(self.by_plain)


@dataclass(frozen=True)
class Needle:
    """One value to look for: `shown` for the reviewer, `kind` says how."""

    shown: str
    plain: str
    flat: str = ""  # the skeleton ("": not looked for so)
    raw: str = ""  # the exact case-folded copy ("": not looked for so)
    kind: str = "text"  # text | compact | number


@dataclass
class _Hit:
    source: _Prepared | _Values
    at: int  # where in `haystack` it was found
    haystack: str
    length: int
    key: str = ""  # a whole value's key

    def excerpt(self) -> str:
        """The source's text around the hit, in its plain form (a hit in
        the skeleton is placed in proportion: forms differ in length); a
        whole value: the value as written."""
        if isinstance(self.source, _Values):
            return self.haystack[:EXCERPT]
        text = self.source.plain
        at = self.at if self.haystack is text else (
            self.at * len(text) // max(1, len(self.haystack)))
        lo = max(0, at - max(0, EXCERPT - self.length) // 2)
        return text[lo:lo + EXCERPT]


@dataclass
class Finder:
    """The turn's sources, prepared once, and the matching of values."""

    sources: list[_Prepared | _Values] = field(default_factory=list)

    @classmethod
    def of(cls, sources: list[LabelledSource]) -> Finder:
        kept: list[_Prepared | _Values] = []
        total = values = 0
        for s in reversed(sources):  # the newest are kept when there are too many
            if s.values:
                if values < MAX_VALUES:
                    v = _Values.of(replace(s, values=s.values[:MAX_VALUES - values]))
                    values += len(v)
                    kept.append(v)
                continue
            if total >= MAX_SOURCE_CHARS or not s.text:
                continue
            if total + len(s.text) > MAX_SOURCE_CHARS:
                s = replace(s, text=s.text[:MAX_SOURCE_CHARS - total])
            total += len(s.text)
            kept.append(_Prepared.of(s))
        return cls(kept[::-1])

    def provenance(self, value: Any) -> list[ProvenanceSource]:
        """Where the values of one argument were found (see the module's rule)."""
        found: list[ProvenanceSource] = []
        seen: set[tuple[str, str, str, bool]] = set()

        def add(h: _Hit, needle: Needle) -> None:
            src = h.source.source
            key = (src.kind, src.tool_call_id, src.title, src.trusted)
            if key not in seen:
                seen.add(key)
                found.append(_described(h, needle))

        def vouched(leaf: str | int | float) -> bool:
            """A leaf that equals a whole value a source vouches for: trusted
            whole (its sub-values are not looked for); listed with the other
            trusted sources that hold it, in conversation order."""
            whole = _whole_needle(leaf)
            if whole is None:
                return False
            hits = [h for p in self.sources if p.source.trusted
                    and whole.plain not in p.source.echoes
                    and (h := _find(p, whole)) is not None]
            if not any(isinstance(h.source, _Values) for h in hits):
                return False
            for h in hits:
                add(h, whole)
            return True

        any_values = any(isinstance(p, _Values) for p in self.sources)
        for needle in needles(value, skip=vouched if any_values else None):
            hits = [h for p in self.sources if needle.plain not in p.source.echoes
                    and (h := _find(p, needle)) is not None]
            trusted = [h for h in hits if h.source.source.trusted]
            for h in trusted or hits:
                add(h, needle)
        trusted_first = sorted(found, key=lambda s: not s.trusted)  # stable: conversation order
        return trusted_first[:MAX_SOURCES_SHOWN]


def derive(rules: dict[str, FlowRule], arguments: Any, sources: list[LabelledSource]
           ) -> FlowVerdict:
    """The verdict on a call of a tool with these rules and these arguments."""
    finder = Finder.of(sources)
    args = arguments if isinstance(arguments, dict) else {}
    provenance: Provenance = {}
    for name in rules:
        if name in args:
            found = finder.provenance(args[name])
            if found:
                provenance[name] = found
    return flow_verdict(rules, provenance)


def leaves(value: Any, depth: int = 0) -> Iterator[str | int | float]:
    """The strings and numbers of a value (keys of objects are not values)."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, str | int | float):
        yield value
    elif depth < MAX_DEPTH and isinstance(value, dict):
        for v in value.values():
            yield from leaves(v, depth + 1)
    elif depth < MAX_DEPTH and isinstance(value, list | tuple):
        for v in value:
            yield from leaves(v, depth + 1)


def needles(value: Any, skip: Callable[[str | int | float], bool] | None = None
            ) -> list[Needle]:
    """What is looked for in the sources, for one argument's value (`skip`:
    leaves already accounted for, none of their needles wanted)."""
    out: list[Needle] = []
    seen: set[tuple[str, str]] = set()
    count = 0
    for leaf in leaves(value):
        count += 1
        if count > MAX_LEAVES:
            break
        if skip is not None and skip(leaf):
            continue
        for n in (_number_needles(leaf) if not isinstance(leaf, str) else _text_needles(leaf)):
            if (n.kind, n.plain) in seen or not n.plain:
                continue
            seen.add((n.kind, n.plain))
            out.append(n)
            if len(out) >= MAX_NEEDLES:
                return out
    return out


def _text_needles(text: str) -> Iterator[Needle]:
    whole = text.strip()
    p = plain(whole)
    if len(p) >= MIN_WHOLE:
        yield Needle(shown=whole, plain=p, flat=flat(p), raw=whole.casefold())
    for m in _EMAIL.finditer(p):
        addr = m.group().strip(_EDGE)
        if "." in addr.rsplit("@", 1)[-1] and addr != p:
            yield Needle(shown=addr, plain=addr, flat=flat(addr))
    for m in _TOKEN.finditer(p):
        token = m.group().strip(_EDGE + "/-")
        if len(token) >= MIN_TOKEN and token != p and any(
                c.isdigit() or c in "@._-/" for c in token):
            yield Needle(shown=token, plain=token, flat=flat(token))
    compact = "".join(p.split())
    for m in _IBAN.finditer(compact):
        yield Needle(shown=m.group().upper(), plain=m.group(), kind="compact")
    for m in _DIGITS.finditer(_SEPARATOR_IN_NUMBER.sub("", p)):
        digits = m.group()
        if sum(c.isdigit() for c in digits) >= MIN_DIGITS:
            yield Needle(shown=digits, plain=digits, kind="number")


def _number_needles(value: int | float) -> Iterator[Needle]:
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return
        if value.is_integer():
            value = int(value)
    text = str(abs(value)) if isinstance(value, int) else repr(abs(value))
    if "e" in text or sum(c.isdigit() for c in text) < MIN_DIGITS:
        return
    yield Needle(shown=text, plain=text, kind="number")


def _whole_needle(leaf: str | int | float) -> Needle | None:
    """A leaf as one needle (its whole value), to compare with whole values."""
    if not isinstance(leaf, str):
        return next(_number_needles(leaf), None)
    whole = leaf.strip()
    p = plain(whole)
    if not p:
        return None
    if _number_form(p) is not None:
        return Needle(shown=whole, plain=p, kind="number")
    return Needle(shown=whole, plain=p, raw=whole.casefold())


def _find(p: _Prepared | _Values, n: Needle) -> _Hit | None:
    if isinstance(p, _Values):
        return p.find(n)
    if n.kind == "number":
        return _find_number(p, n)
    if n.kind == "compact":
        at = p.compact.find(n.plain)
        return None if at < 0 else _Hit(p, at, p.compact, len(n.plain))
    hit = _bounded_find(p.plain, n.plain)
    if hit is not None:
        return _Hit(p, hit, p.plain, len(n.plain))
    # Confusables matter where one side is not ASCII (a Cyrillic "о" in an
    # address); two ASCII texts are compared as written (the skeleton would
    # call "rn" an "m").
    if n.flat and not (p.ascii and n.plain.isascii()):
        hit = _bounded_find(p.flat, n.flat)
        if hit is not None:
            return _Hit(p, hit, p.flat, len(n.flat))
    if n.raw:
        hit = _bounded_find(p.raw, n.raw)
        if hit is not None:
            return _Hit(p, hit, p.raw, len(n.raw))
    return None


def _find_number(p: _Prepared, n: Needle) -> _Hit | None:
    """A number at digit boundaries: 1500 in "1,500.00" and "EUR 1500", not
    in "15000" or "2.1500"."""
    whole = n.plain.partition(".")[0]
    if whole not in p.numbers:  # the common case, at the speed of str.find
        return None
    m = _number_pattern(n.plain).search(p.numbers)
    return None if m is None else _Hit(p, m.start(), p.numbers, m.end() - m.start())


@lru_cache(maxsize=1024)
def _number_pattern(number: str) -> re.Pattern[str]:
    whole, _, fraction = number.partition(".")
    fraction = fraction.rstrip("0")
    tail = rf"\.{re.escape(fraction)}0*" if fraction else r"(?:\.0+)?"
    return re.compile(rf"(?<![\d.]){re.escape(whole)}{tail}(?![\d])")


def _bounded_find(hay: str, needle: str) -> int | None:
    """The first occurrence of `needle` at word boundaries (an edge that is a
    letter or digit must not touch another), among the first few."""
    start = 0
    for _ in range(MAX_OCCURRENCES):
        at = hay.find(needle, start)
        if at < 0:
            return None
        end = at + len(needle)
        before_ok = at == 0 or not (needle[0].isalnum() and hay[at - 1].isalnum())
        after_ok = end >= len(hay) or not (needle[-1].isalnum() and hay[end].isalnum())
        if before_ok and after_ok:
            return at
        start = at + 1
    return None


def _described(h: _Hit, n: Needle) -> ProvenanceSource:
    src = h.source.source
    excerpt = h.excerpt()
    return ProvenanceSource(
        kind=src.kind, trusted=src.trusted, tool_name=src.tool_name[:200],
        tool_call_id=src.tool_call_id[:200], title=mask_text(src.title[:200]),
        value=_cut(_masked_value(_cut(n.shown, 4 * VALUE)), VALUE),
        excerpt=_cut(mask_text(excerpt), EXCERPT), key=mask_text(h.key[:200]))


# A value that is only a number of this many digits or more (with the
# separators numbers are written with) is masked as the masker masks a phone
# number: alone, without the words around it, the masker cannot tell one.
NUMBER_DIGITS = 7
_NUMBER_FORM = re.compile(r"[+(]?[\d][\d\s().\-/]*")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _masked_value(text: str) -> str:
    masked = mask_text(text)
    if _ISO_DATE.fullmatch(masked):
        return masked
    if _NUMBER_FORM.fullmatch(masked) and sum(ch.isdigit() for ch in masked) >= NUMBER_DIGITS:
        return "*" * (sum(ch.isdigit() for ch in masked) - 2) + "".join(
            [ch for ch in masked if ch.isdigit()][-2:])
    return masked


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"
