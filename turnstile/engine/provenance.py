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

Pure and bounded: every loop has a cap (sources, bytes, needles, leaves,
occurrences), every pattern runs in linear time. Run in the `review_call`
activity, whose result records it in the turn's history.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
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
    source: _Prepared
    at: int  # where in `haystack` it was found
    haystack: str
    length: int

    def excerpt(self) -> str:
        """The source's text around the hit, in its plain form (a hit in
        the skeleton is placed in proportion: forms differ in length)."""
        text = self.source.plain
        at = self.at if self.haystack is text else (
            self.at * len(text) // max(1, len(self.haystack)))
        lo = max(0, at - max(0, EXCERPT - self.length) // 2)
        return text[lo:lo + EXCERPT]


@dataclass
class Finder:
    """The turn's sources, prepared once, and the matching of values."""

    sources: list[_Prepared] = field(default_factory=list)

    @classmethod
    def of(cls, sources: list[LabelledSource]) -> Finder:
        kept: list[LabelledSource] = []
        total = 0
        for s in reversed(sources):  # the newest are kept when there are too many
            if total + len(s.text) > MAX_SOURCE_CHARS:
                s = replace(s, text=s.text[:MAX_SOURCE_CHARS - total])
            total += len(s.text)
            kept.append(s)
            if total >= MAX_SOURCE_CHARS:
                break
        return cls([_Prepared.of(s) for s in reversed(kept) if s.text])

    def provenance(self, value: Any) -> list[ProvenanceSource]:
        """Where the values of one argument were found (see the module's rule)."""
        found: list[ProvenanceSource] = []
        seen: set[tuple[str, str, str, bool]] = set()
        for needle in needles(value):
            hits = [h for p in self.sources if needle.plain not in p.source.echoes
                    and (h := _find(p, needle)) is not None]
            trusted = [h for h in hits if h.source.source.trusted]
            for h in trusted or hits:
                src = h.source.source
                key = (src.kind, src.tool_call_id, src.title, src.trusted)
                if key in seen:
                    continue
                seen.add(key)
                found.append(_described(h, needle))
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


def needles(value: Any) -> list[Needle]:
    """What is looked for in the sources, for one argument's value."""
    out: list[Needle] = []
    seen: set[tuple[str, str]] = set()
    count = 0
    for leaf in leaves(value):
        count += 1
        if count > MAX_LEAVES:
            break
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


def _find(p: _Prepared, n: Needle) -> _Hit | None:
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
        excerpt=_cut(mask_text(excerpt), EXCERPT))


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
