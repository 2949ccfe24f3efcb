"""Masking as a property of turnstile.engine.masking itself (fast: no
server). Generated addresses and phone numbers in every form docs/masking.md
names (tests/support/masking_strategies.py) are masked wherever a value can
hold them — in text, as an object's key, as a value, an integer, in JSON
inside a string — and what must stay as written stays: ids, timestamps,
counts, UUIDs and amounts. The longer runs: bench/masking_properties.py
(which runs the `PROPERTIES` below with more examples).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support.masking_strategies import (
    Form,
    addresses,
    integer_phones,
    kept_values,
    leaks,
    phones,
)
from turnstile.engine.masking import mask_any, mask_json_text, mask_text, mask_value

EXAMPLES = 200
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _sinks(forms: list[Form], numbers: list[tuple[str | None, int, Form]]) -> dict[str, str]:
    """The forms written every way a sink receives them, masked."""
    text = "to " + " ; ".join(f.text for f in forms) + " now"
    record: dict[str, object] = {f.text: i for i, f in enumerate(forms)}  # as keys
    record["values"] = [f.text for f in forms]
    record["nested"] = json.dumps({"deeper": json.dumps({"to": text})})
    listed: list[int] = []
    for name, value, _ in numbers:
        if name is None:
            listed.append(value)
        else:
            record[name] = value
    record["list"] = listed
    return {
        "text": mask_text(text),
        "value": json.dumps(mask_value(record), ensure_ascii=False),
        "json text": mask_json_text(json.dumps(record)),
        "json text, ascii": mask_json_text(json.dumps(record, ensure_ascii=True)),
        "any": json.dumps(mask_any({"wrapped": [record]}), ensure_ascii=False),
    }


def no_address_or_number_survives(forms: list[Form],
                                  numbers: list[tuple[str | None, int, Form]]) -> None:
    sinks = _sinks(forms, numbers)
    assert leaks(sinks, forms + [f for _, _, f in numbers]) == [], sinks


def masking_twice_changes_nothing(form: Form) -> None:
    once = mask_text(f"from {form.text} ok")
    assert mask_text(once) == once
    value = mask_value({form.text: [form.text]})
    assert mask_value(value) == value


def what_must_stay_stays(kept: dict[str, Any], forms: list[Form]) -> None:
    record = {"keep": kept, "masked": [f.text for f in forms]}
    assert mask_value(record)["keep"] == kept
    assert json.loads(mask_json_text(json.dumps(record)))["keep"] == kept
    for name in ("uuid", "run", "when", "label"):  # as text too, e.g. on a log line
        line = f"{name}: {kept[name]}"
        assert mask_text(line) == line


FORMS = addresses() | phones()
# name -> (the property, its strategies)
PROPERTIES: dict[str, tuple[Callable[..., None], dict[str, st.SearchStrategy[Any]]]] = {
    "no address or number survives": (no_address_or_number_survives, {
        "forms": st.lists(FORMS, min_size=1, max_size=6),
        "numbers": st.lists(integer_phones(), max_size=4)}),
    "masking twice changes nothing": (masking_twice_changes_nothing, {"form": FORMS}),
    "ids, times, counts, UUIDs, amounts stay": (what_must_stay_stays, {
        "kept": kept_values(), "forms": st.lists(FORMS, max_size=2)}),
}


def _test(name: str) -> Callable[[], None]:
    check, strategies = PROPERTIES[name]
    return SETTINGS(given(**strategies)(check))  # type: ignore[no-any-return]


test_no_generated_address_or_number_survives_masking = _test("no address or number survives")
test_masking_twice_changes_nothing = _test("masking twice changes nothing")
test_ids_timestamps_counts_uuids_and_amounts_stay = _test(
    "ids, times, counts, UUIDs, amounts stay")
