"""The identity rule of turns begun before revision 4, frozen: what they
replay with (turnstile.engine.approvals.NameRule.STANDARD; docs/identity.md,
"Determinism and replay"). Today's rule is turnstile.engine.identity.

It took the skeleton only after RFC 8265 had lower-cased the name (so `ТОМ`,
Cyrillic capitals, was not `tom`), and removed lone surrogates, private-use
and control characters as it removed zero-width ones (so `b\\ud800ob` was
`bob`). Do not change it: a decision a turn took by it must be taken again
when the turn's history is replayed.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from functools import lru_cache

from turnstile.engine.identity import PROFILE, PROTOTYPE, ignorable, prepared


def _enforced(name: str) -> tuple[str | None, str | None]:
    text = prepared(name)
    if not text:
        return None, "it is empty"
    parts: list[str] = []
    for part in text.split(" "):
        try:
            parts.append(PROFILE.enforce(part))
        except UnicodeEncodeError as err:
            return None, str(err.reason)
    return " ".join(parts), None


@lru_cache(maxsize=4096)
def canonical(name: str) -> str | None:
    return _enforced(name)[0]


def name_problem(name: str) -> str | None:
    problem = _enforced(name)[1]
    return None if problem is None else f"not a valid name (RFC 8265 UsernameCaseMapped: {problem})"


def skeleton(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", "".join(ch for ch in text if not ignorable(ch)))
    return unicodedata.normalize("NFD", "".join(PROTOTYPE.get(ch, ch) for ch in decomposed))


@lru_cache(maxsize=4096)
def person_key(name: str) -> str:
    text = canonical(name)
    if text is None:
        text = unicodedata.normalize("NFKC", prepared(name)).casefold()
    key = skeleton(text)
    for _ in range(4):
        again = skeleton(key.casefold())
        if again == key:
            break
        key = again
    return key


def same_person(a: str, b: str) -> bool:
    key = person_key(a)
    return bool(key) and key == person_key(b)


def is_listed(name: str, names: Iterable[str]) -> bool:
    who = canonical(name)
    return who is not None and any(canonical(n) == who for n in names)
