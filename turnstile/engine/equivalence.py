"""When two calls of a tool mean the same: the comparison form of validated
arguments (the repeat breaker, turnstile.engine.repeats; docs/semantics.md,
"The repeat breaker").

A call is compared as the tool's pydantic model parsed it, not as the model
wrote it: defaults filled in, values coerced to their types, every string in
Unicode NFC with surrounding whitespace removed. A field may declare how its
values compare with an `Annotated` marker:

    to: Annotated[str, EMAIL_ADDRESS]                  # ops@Example.COM == ops@example.com
    customerIds: Annotated[list[str], AS_SET]          # order and duplicates do not count
    code: Annotated[str, VERBATIM]                     # exactly as written (no trim)

Markers nest: a list of addresses compared as a set is
`Annotated[list[Annotated[str, EMAIL_ADDRESS]], AS_SET]` (or one marker with
both: `Equivalence(text="email", as_set=True)`).

E-mail addresses compare case-insensitively as a whole, local part included:
RFC 5321 lets a receiving server treat local parts case-sensitively, but no
mainstream mail system does, and the breaker's false merge (a second mail to
`OPS@x` withheld because one went to `ops@x`) is the lesser harm than the
false split it replaces (a duplicate mail sent). Dots, `+tags` and the like
are not folded: `a.b@x` and `ab@x`, `a+1@x` and `a@x` stay different.

An MCP tool's arguments (checked against its JSON schema, not parsed by a
model) compare as given, with every string NFC and trimmed: no defaults are
filled in and no field declares an equivalence.

Pure and deterministic (no I/O): the worker computes the key in the
activities that validate a call, and history records it.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel

TextRule = Literal["trimmed", "verbatim", "caseless", "email"]


@dataclass(frozen=True)
class Equivalence:
    """How the repeat breaker compares one field's values (an Annotated marker).

    `text`: how strings compare — "trimmed" (the default for every string:
    NFC, surrounding whitespace removed), "verbatim" (NFC only), "caseless"
    (trimmed and case-folded), "email" (trimmed and case-folded, a trailing
    dot of the domain removed). `as_set`: a list compares as the set of its
    items (order and duplicates do not count)."""

    text: TextRule = "trimmed"
    as_set: bool = False


EMAIL_ADDRESS = Equivalence(text="email")
CASELESS = Equivalence(text="caseless")
VERBATIM = Equivalence(text="verbatim")
AS_SET = Equivalence(as_set=True)
DEFAULT = Equivalence()


def normal_text(value: str, rule: TextRule = "trimmed") -> str:
    """A string as it is compared under `rule`."""
    text = unicodedata.normalize("NFC", value)
    if rule == "verbatim":
        return text
    text = text.strip()
    if rule == "caseless":
        return unicodedata.normalize("NFC", text.casefold())
    if rule == "email":
        local, at, domain = text.rpartition("@")
        if not at:
            return unicodedata.normalize("NFC", text.casefold())
        return unicodedata.normalize("NFC", f"{local.casefold()}@{domain.casefold().rstrip('.')}")
    return text


def _marker(metadata: list[Any] | tuple[Any, ...]) -> Equivalence | None:
    found = [m for m in metadata if isinstance(m, Equivalence)]
    return found[-1] if found else None


def _item_type(annotation: Any) -> Any:
    """The item type of a list/tuple/set annotation (Any when unknown)."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    args = get_args(annotation)
    if get_origin(annotation) in (list, tuple, set, frozenset) and args:
        return args[0]
    return Any


def _annotated_marker(annotation: Any) -> Equivalence | None:
    if get_origin(annotation) is Annotated:
        return _marker(get_args(annotation)[1:])
    return None


def comparison_form(value: Any, rule: Equivalence = DEFAULT, annotation: Any = Any) -> Any:
    """A validated value as the repeat breaker compares it: JSON values only,
    equal for equivalent values."""
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        form = {normal_text(str(name)): comparison_form(
                    getattr(value, name), _marker(info.metadata) or DEFAULT, info.annotation)
                for name, info in fields.items()}
        # A model that keeps undeclared fields (an MCP tool's arguments, checked
        # against its JSON schema): those compare with the default rule.
        for name, extra in (value.model_extra or {}).items():
            form.setdefault(normal_text(str(name)), comparison_form(extra))
        return form
    if isinstance(value, str):
        return normal_text(value, rule.text)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, Enum):
        return comparison_form(value.value, rule)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)
    if isinstance(value, Decimal):
        # 12.5 and 12.50 are one amount.
        return "0" if value.is_zero() else format(value.normalize(), "f")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {normal_text(str(k)): comparison_form(v, rule) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        item_type = _item_type(annotation)
        item_rule = _annotated_marker(item_type) or Equivalence(text=rule.text)
        items = [comparison_form(v, item_rule, item_type) for v in value]
        if rule.as_set or isinstance(value, set | frozenset):
            unique = {_canonical(i): i for i in items}
            items = [unique[k] for k in sorted(unique)]
        return items
    return normal_text(str(value), rule.text)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def comparison_key(tool_name: str, arguments: BaseModel) -> str:
    """What makes two validated calls the same effect: sha256 hex of the tool's
    name and the arguments' comparison form (prefixed "v:", never equal to a
    raw-argument key)."""
    text = _canonical(comparison_form(arguments))
    digest = hashlib.sha256(f"{tool_name}\x00{text}".encode("utf-8", "surrogatepass"))
    return "v:" + digest.hexdigest()
