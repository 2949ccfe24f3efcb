"""Who a name is: one normalisation for every comparison of people.

Reviewer, requester and approver-list names are compared by `name_key`, never
as typed: NFKC (full-width and compatibility letters become plain ones),
case-folded, control and format characters removed (zero-width spaces and
joiners, bidi marks, escapes), whitespace collapsed and trimmed. "Alice",
" alice ", "ＡＬＩＣＥ" and "al\u200bice" are one person; a name whose key is
empty names nobody and is refused.
"""

from __future__ import annotations

import unicodedata


def name_key(name: str) -> str:
    """The identity a name stands for ("" when it names nobody)."""
    text = unicodedata.normalize("NFKC", name)
    kept = "".join(" " if ch.isspace() else ch for ch in text
                   if unicodedata.category(ch) not in {"Cc", "Cf", "Cs", "Co", "Cn"}
                   or ch.isspace())
    folded = unicodedata.normalize("NFKC", kept.casefold())
    return " ".join(folded.split())


def same_person(a: str, b: str) -> bool:
    """`a` and `b` name the same, non-empty identity."""
    key = name_key(a)
    return bool(key) and key == name_key(b)
