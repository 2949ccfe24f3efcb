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


def has_unsafe_text(value: Any) -> bool:
    """Does a decoded JSON value hold a string (key or value) with a lone
    surrogate or NUL? Iterative: nesting depth is the decoder's to bound."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _UNSAFE.search(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False
