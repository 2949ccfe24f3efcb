"""How the inbox shows a call's arguments and reads a reviewer's edits of
them. Pure functions (no I/O): the pages in app.py call them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from difflib import SequenceMatcher
from typing import Any
from urllib.parse import quote, urlencode

from turnstile.engine.masking import MASKED, mask_value


def shown_arguments(arguments: Any, review_fields: Any) -> Any:
    """The arguments as the reviewer sees them: masked as the audit log masks
    them, except the fields the reviewer must see to decide (the tool's
    review fields, e.g. an e-mail's recipient)."""
    masked = mask_value(arguments)  # sensitive keys (`password`, ...) included
    if not isinstance(arguments, dict) or not isinstance(masked, dict):
        return masked
    keep = set(review_fields)
    if len(masked) != len(arguments):  # keys the mask made equal: none kept in clear
        return masked
    return {(real if real in keep else key): (arguments[real] if real in keep else value)
            for real, (key, value) in zip(arguments, masked.items(), strict=True)}


def as_json(value: Any) -> str:
    # JSON as the reviewer reads it (characters, not \u escapes); Jinja escapes it.
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


@dataclass(frozen=True)
class Field:
    """One argument as the page shows it: text (with its line breaks) or JSON."""

    name: str
    text: str
    is_text: bool
    editable: bool  # a review field (text or a number): edited in place
    multiline: bool


def fields(shown: Any, review_fields: Any) -> list[Field]:
    if not isinstance(shown, dict):
        return [Field("arguments", as_json(shown), False, False, True)]
    keep = set(review_fields)
    out = []
    for name, value in shown.items():
        is_text = isinstance(value, str)
        text = value if is_text else as_json(value)
        editable = name in keep and (is_text or editable_number(value))
        out.append(Field(name, text, is_text, editable, "\n" in text or len(text) > 80))
    return out


class EditProblem(ValueError):
    """The reviewer's edit cannot be read (not JSON, not an object, a number
    field that holds no number, a cut into a masked part)."""


def edited_arguments(original: Any, review_fields: Any, form: dict[str, str]
                     ) -> dict[str, Any] | None:
    """The complete arguments the reviewer approves, or None when unchanged.

    Edits are made on the real arguments, never on what the page showed:
    `form["arguments_json"]` is the arguments as the page showed them
    (masked except the review fields), possibly edited, and is merged onto
    the real ones (`merged`): a value left as shown keeps its original, a
    field left out is kept, and only what the reviewer changed changes. Then
    each review field `edit.NAME` the reviewer changed in place wins (text,
    or a number for a number field)."""
    if not isinstance(original, dict):
        return None
    shown = shown_arguments(original, review_fields)
    raw = form.get("arguments_json")
    edited = dict(original)
    if raw is not None and raw.strip():
        merged_value = merged(original, shown, _parsed(raw), "arguments")
        assert isinstance(merged_value, dict)
        edited = dict(merged_value)  # (the original itself when nothing changed)
    for name in review_fields:
        key = f"edit.{name}"
        if key not in form or name not in original:
            continue
        value = _in_place(name, original[name], form[key])
        if value != original[name]:
            edited[name] = value
    return None if edited == original else edited


def _in_place(name: str, original: Any, text: str) -> Any:
    """A review field's value as the reviewer typed it in place."""
    if isinstance(original, str):
        return _normal_newlines(text)
    if editable_number(original):
        cleaned = text.strip()
        if cleaned == as_json(original):
            return original
        try:
            number = int(cleaned) if isinstance(original, int) else float(cleaned)
        except ValueError as err:
            kind = "a whole number" if isinstance(original, int) else "a number"
            raise EditProblem(f"{name} must be {kind} (not {cleaned[:40]!r})") from err
        if isinstance(number, float) and not math.isfinite(number):
            raise EditProblem(f"{name} must be a finite number")
        return number
    return original


def editable_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def merged(real: Any, shown: Any, submitted: Any, where: str) -> Any:
    """`submitted` (an edit of `shown`, the masked form of `real`) made on `real`.

    What equals what was shown is the real value; objects are merged key by
    key (a key left out is kept, a new key added; keys the mask rewrote are
    matched by position); lists element by element; a text edited in part is
    edited in the real text at the same place (`merged_text`); anything else
    the reviewer typed is taken as typed."""
    if submitted == shown:
        return real
    if isinstance(real, dict) and isinstance(shown, dict) and isinstance(submitted, dict):
        keys = (dict(zip(shown, real, strict=True)) if len(shown) == len(real)
                else {k: k for k in shown if k in real})
        out = dict(real)
        for key, value in submitted.items():
            if key in keys:
                out[keys[key]] = merged(real[keys[key]], shown[key], value, f"{where}.{key}")
            else:
                out[key] = value
        return out
    if isinstance(real, list) and isinstance(shown, list) and isinstance(submitted, list):
        if len(submitted) == len(shown) == len(real):
            return [merged(r, s, v, f"{where}[{i}]")
                    for i, (r, s, v) in enumerate(zip(real, shown, submitted, strict=True))]
        unused = list(range(len(shown)))
        items = []
        for value in submitted:  # an element left as shown is its real one
            found = next((j for j in unused if shown[j] == value), None)
            if found is None:
                items.append(value)
            else:
                unused.remove(found)
                items.append(real[found])
        return items
    if isinstance(submitted, str) and isinstance(shown, str):
        if isinstance(real, str):
            return merged_text(real, shown, submitted, where)
        if editable_number(real):
            text = merged_text(as_json(real), shown, submitted, where)
            try:
                return type(real)(text)
            except ValueError:
                return text  # the tool's validation says what is wrong with it
        if MASKED in submitted and submitted != shown:
            raise EditProblem(f"{where} is masked: type its whole new value (only part of "
                              f"the mask was edited)")
    return submitted


def merged_text(real: str, shown: str, submitted: str, where: str) -> str:
    """The reviewer's edit of `shown` (the masked `real`) made on `real`.

    The masked text is aligned with the real one (what the mask left is
    equal, what it replaced is a masked part), the reviewer's edit with the
    masked text; each change is made at the same place in the real text. A
    change that replaces a masked part whole takes what the reviewer typed; a
    change that cuts into a masked part cannot be placed and is refused."""
    if submitted == shown:
        return real
    align = SequenceMatcher(None, shown, real, autojunk=False).get_opcodes()

    def to_real(pos: int) -> int | None:
        for tag, i1, i2, j1, j2 in align:
            if tag == "equal" and i1 <= pos <= i2:
                return j1 + (pos - i1)
            if tag != "equal" and pos in (i1, i2):
                return j1 if pos == i1 else j2
        return None

    out, done = [], 0
    for tag, i1, i2, k1, k2 in SequenceMatcher(None, shown, submitted,
                                               autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        start, end = to_real(i1), to_real(i2)
        if start is None or end is None or start < done:
            raise EditProblem(f"{where}: the edit cuts into a masked part ({shown!r}): "
                              f"replace the masked part whole, or type the whole value")
        out.append(real[done:start])
        out.append(_normal_newlines(submitted[k1:k2]))
        done = end
    out.append(real[done:])
    return "".join(out)


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


def call_url(workflow_id: str, tool_call_id: str) -> str:
    """A call's page: the ids as query parameters, every reserved character
    encoded, so no id ("/", "..", "%2F", "?", "#") can change where a link
    leads (a path would be normalised by browsers and proxies)."""
    return "/call?" + urlencode({"workflow": workflow_id, "call": tool_call_id},
                                quote_via=quote, safe="")
