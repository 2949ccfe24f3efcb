"""How the inbox shows a call's arguments and reads a reviewer's edits of
them. Pure functions (no I/O): the pages in app.py call them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from turnstile.engine.masking import mask_value


def shown_arguments(arguments: Any, review_fields: Any) -> Any:
    """The arguments as the reviewer sees them: masked as the audit log masks
    them, except the fields the reviewer must see to decide (the tool's
    review fields, e.g. an e-mail's recipient)."""
    if not isinstance(arguments, dict):
        return mask_value(arguments)
    keep = set(review_fields)
    return {k: (v if k in keep else mask_value(v)) for k, v in arguments.items()}


def as_json(value: Any) -> str:
    # JSON as the reviewer reads it (characters, not \u escapes); Jinja escapes it.
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


@dataclass(frozen=True)
class Field:
    """One argument as the page shows it: text (with its line breaks) or JSON."""

    name: str
    text: str
    is_text: bool
    editable: bool  # a review field: edited in place
    multiline: bool


def fields(shown: Any, review_fields: Any) -> list[Field]:
    if not isinstance(shown, dict):
        return [Field("arguments", as_json(shown), False, False, True)]
    keep = set(review_fields)
    out = []
    for name, value in shown.items():
        is_text = isinstance(value, str)
        text = value if is_text else as_json(value)
        out.append(Field(name, text, is_text, name in keep and is_text,
                         "\n" in text or len(text) > 80))
    return out


class EditProblem(ValueError):
    """The reviewer's edit cannot be read (not JSON, not an object)."""


def edited_arguments(original: Any, review_fields: Any, form: dict[str, str]
                     ) -> dict[str, Any] | None:
    """The complete arguments the reviewer approves, or None when unchanged.

    `form["arguments_json"]`: the full arguments as the page showed them
    (masked except the review fields), possibly edited; a value left as shown
    keeps its original (so masking is not sent back as the edit). Then each
    review field `edit.NAME` the reviewer changed in place wins."""
    if not isinstance(original, dict):
        return None
    shown = shown_arguments(original, review_fields)
    raw = form.get("arguments_json")
    edited = dict(original)
    if raw is not None and raw.strip() and json.loads(as_json(shown)) != _parsed(raw):
        submitted = _parsed(raw)
        edited = {k: (original[k] if k in shown and shown[k] == v else v)
                  for k, v in submitted.items()}
    for name in review_fields:
        key = f"edit.{name}"
        if key in form and isinstance(original.get(name), str) and form[key] != original[name]:
            edited[name] = _normal_newlines(form[key])
    return None if edited == original else edited


def _normal_newlines(text: str) -> str:
    # Browsers submit a textarea's line breaks as CRLF.
    return text.replace("\r\n", "\n")


def _parsed(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise EditProblem(f"the edited arguments are not JSON: {err}") from err
    if not isinstance(value, dict):
        raise EditProblem("the edited arguments must be a JSON object (the complete arguments)")
    return value


def changed_fields(original: Any, edited: dict[str, Any] | None) -> list[str]:
    if edited is None or not isinstance(original, dict):
        return []
    return sorted(k for k in set(original) | set(edited) if original.get(k) != edited.get(k))


def utc_text(iso: str) -> str:
    """A timestamp for a page without script: to the second, UTC (the page's
    script shows it relative, in the reviewer's time zone)."""
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def matches(needle: str, *haystack: Any) -> bool:
    """A case-insensitive substring filter over the values shown."""
    if not needle:
        return True
    low = needle.casefold()
    return any(low in str(h).casefold() for h in haystack)
