"""Text every sink can hold.

Two kinds of characters arrive in model responses and tool arguments that no
Temporal payload or database can take as they are: a lone UTF-16 surrogate
(JSON's "\\ud800" without its pair decodes to one; it cannot be encoded as
UTF-8, so the payload converter fails) and NUL (PostgreSQL text cannot hold
it). An exception on such text inside a workflow task would be retried
forever; inside an activity, every retry fails the same way. So they are
made safe where they enter: provider responses are cleaned here (each is
replaced by U+FFFD, the replacement character), and tool arguments that
would decode to them are refused as argument errors the model can correct.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
_UNSAFE = re.compile("[\x00\ud800-\udfff]")


def safe_text(text: str) -> str:
    """`text` with every lone surrogate and NUL replaced by U+FFFD."""
    return _UNSAFE.sub(REPLACEMENT, text)


def unsafe_text_at(value: Any) -> str | None:
    """Where a decoded JSON value holds a string (key or value) with a lone
    surrogate or NUL, as a dotted path ("(arguments)" for the top), or None.
    Iterative: nesting depth is the decoder's to bound."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if _UNSAFE.search(v):
                return path or "(arguments)"
        elif isinstance(v, dict):
            for k, item in v.items():
                where = f"{path}.{k}" if path else str(k)
                if isinstance(k, str) and _UNSAFE.search(k):
                    return safe_text(where)
                stack.append((where, item))
        elif isinstance(v, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(v))
    return None


def has_unsafe_text(value: Any) -> bool:
    return unsafe_text_at(value) is not None
