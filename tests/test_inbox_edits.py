"""A reviewer's edits are made on the real arguments (turnstile.inbox.views):
the page shows the arguments masked, the JSON editor submits what the
reviewer changed of that, and the server merges it onto the real arguments.
Generated arguments (addresses, phone numbers, text, numbers, lists,
objects; Hypothesis, derandomized, bounded): the page's JSON submitted as
shown changes nothing; an edit outside a masked part changes exactly that
part of the real value; a field replaced whole is the reviewer's value; a
field left out is kept; an edit cutting into a masked part is refused. A
number review field is edited in place. The end-to-end check (a real turn,
the tool receiving the real value with only the edited part changed) is in
tests/test_inbox_browser.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from turnstile.engine.masking import MASKED
from turnstile.inbox.views import (
    EditProblem,
    as_json,
    edited_arguments,
    fields,
    merged_text,
    shown_arguments,
)

EXAMPLES = 150
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

locals_ = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=2, max_size=10).filter(
    lambda s: s[0].isalpha())
domains = st.builds(lambda a, b: f"{a}.{b}",
                    st.text("abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=8),
                    st.sampled_from(["com", "org", "example", "net"]))
addresses = st.builds(lambda local, domain: f"{local}@{domain}", locals_, domains)
phones = st.integers(1000, 9999).map(lambda n: f"+1 415 555 {n}")
plain = st.text("abcdefgh ijk", min_size=1, max_size=20).map(str.strip).filter(bool)


def _form(value: Any) -> dict[str, str]:
    return {"arguments_json": as_json(value)}


@st.composite
def arguments(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "to": draw(addresses),
        "cc": draw(st.lists(addresses, min_size=1, max_size=3)),
        "note": f"call {draw(phones)} or write to {draw(addresses)}",
        "subject": draw(plain),
        "amount": draw(st.integers(0, 10_000)),
        "meta": {"owner": draw(addresses), "count": draw(st.integers(0, 9))},
    }


@SETTINGS
@given(arguments())
def test_the_page_submitted_as_shown_changes_nothing(args: dict[str, Any]) -> None:
    shown = shown_arguments(args, [])
    assert shown["to"] != args["to"] and MASKED in shown["to"]  # the page masks it
    assert edited_arguments(args, [], _form(shown)) is None
    # The same with the fields in another order and one left out.
    reordered = dict(reversed(list(shown.items())))
    reordered.pop("subject")
    assert edited_arguments(args, [], _form(reordered)) is None


@SETTINGS
@given(arguments(), domains, st.sampled_from(["to", "cc", "note", "meta"]))
def test_a_domain_edited_in_the_mask_changes_only_the_domain(
        args: dict[str, Any], new_domain: str, where: str) -> None:
    shown = shown_arguments(args, [])
    submitted = json.loads(as_json(shown))

    def swap(masked: str, real: str) -> tuple[str, str]:
        old = real.rpartition("@")[2]
        return masked.replace("@" + old, "@" + new_domain), real.replace("@" + old,
                                                                         "@" + new_domain)

    expected = json.loads(json.dumps(args))
    if where == "to":
        submitted["to"], expected["to"] = swap(shown["to"], args["to"])
    elif where == "cc":
        submitted["cc"][0], expected["cc"][0] = swap(shown["cc"][0], args["cc"][0])
    elif where == "meta":
        submitted["meta"]["owner"], expected["meta"]["owner"] = swap(
            shown["meta"]["owner"], args["meta"]["owner"])
    else:
        address = args["note"].rpartition(" ")[2]
        masked = shown["note"].rpartition(" ")[2]
        new_masked, new_real = swap(masked, address)
        submitted["note"] = shown["note"][:-len(masked)] + new_masked
        expected["note"] = args["note"][:-len(address)] + new_real
    edited = edited_arguments(args, [], _form(submitted))
    if expected == args:  # the new domain is the old one
        assert edited is None
        return
    assert edited == expected
    assert not any(MASKED in json.dumps(v) for v in (edited or {}).values())


@SETTINGS
@given(arguments(), st.sampled_from(["to", "note", "subject", "amount", "meta"]),
       st.one_of(addresses, plain, st.integers(-5, 5)))
def test_a_field_replaced_whole_is_the_reviewers_value(
        args: dict[str, Any], name: str, value: Any) -> None:
    submitted = json.loads(as_json(shown_arguments(args, [])))
    submitted[name] = value
    edited = edited_arguments(args, [], _form(submitted))
    expected = {**args, name: value}
    assert (edited if edited is not None else args) == expected


@SETTINGS
@given(arguments(), st.integers(0, 99))
def test_the_visible_digits_of_a_masked_phone_number(args: dict[str, Any], last: int) -> None:
    shown = shown_arguments(args, [])
    phone = args["note"].split(" or ")[0]
    masked = shown["note"].split(" or ")[0]
    assert MASKED[0] in masked and masked[-2:] == phone[-2:]
    submitted = {**shown, "note": shown["note"].replace(masked, masked[:-2] + f"{last:02d}")}
    edited = edited_arguments(args, [], _form(submitted)) or args
    assert edited["note"] == args["note"].replace(phone, phone[:-2] + f"{last:02d}")


@pytest.mark.parametrize("cut", [
    lambda m: m.replace("***", "**"),  # a star removed
    lambda m: m.replace("***", "*x**"),  # typed inside the mask
])
def test_an_edit_cutting_into_a_masked_part_is_refused(cut: Any) -> None:
    args = {"to": "bob@example.com", "subject": "hi"}
    shown = shown_arguments(args, [])
    with pytest.raises(EditProblem, match="cuts into a masked part"):
        edited_arguments(args, [], _form({**shown, "to": cut(shown["to"])}))
    # The masked part replaced whole is a new local part.
    edited = edited_arguments(args, [], _form({**shown, "to": shown["to"].replace("b***",
                                                                                  "carol")}))
    assert edited == {"to": "carol@example.com", "subject": "hi"}


def test_merged_text_places_each_change_in_the_real_text() -> None:
    real = "write to ann@corp.example or bob@corp.example today"
    shown = "write to a***@corp.example or b***@corp.example today"
    assert merged_text(real, shown, shown.replace("today", "tomorrow"), "x") == (
        "write to ann@corp.example or bob@corp.example tomorrow")
    assert merged_text(real, shown, "Write" + shown[5:], "x") == "Write" + real[5:]
    assert merged_text(real, shown, shown.replace(" or b***@corp.example", ""), "x") == (
        "write to ann@corp.example today")


def test_number_review_fields_are_edited_in_place() -> None:
    args = {"to": "bob@example.com", "amount": 7, "rate": 1.5, "flag": True}
    shown = fields(shown_arguments(args, ["amount", "rate", "flag"]), ["amount", "rate", "flag"])
    editable = {f.name: f.editable for f in shown}
    assert editable == {"to": False, "amount": True, "rate": True, "flag": False}
    review = ["amount", "rate"]
    assert edited_arguments(args, review, {"edit.amount": "7", "edit.rate": "1.5"}) is None
    assert edited_arguments(args, review, {"edit.amount": " 12 "}) == {**args, "amount": 12}
    assert edited_arguments(args, review, {"edit.rate": "2.25"}) == {**args, "rate": 2.25}
    with pytest.raises(EditProblem, match="amount must be a whole number"):
        edited_arguments(args, review, {"edit.amount": "12.5"})
    with pytest.raises(EditProblem, match="rate must be a finite number"):
        edited_arguments(args, review, {"edit.rate": "inf"})
    # An in-place edit wins over the JSON editor's value of the same field.
    both = {"edit.amount": "9", "arguments_json": as_json({**shown_arguments(args, review),
                                                           "amount": 8})}
    assert edited_arguments(args, review, both) == {**args, "amount": 9}


def test_a_new_field_is_added_and_a_masked_object_replaced_whole() -> None:
    args = {"to": "bob@example.com", "password": {"v": "hunter2"}}
    shown = shown_arguments(args, [])
    assert shown["password"] == MASKED
    assert edited_arguments(args, [], _form({**shown, "extra": 1})) == {**args, "extra": 1}
    assert edited_arguments(args, [], _form({**shown, "password": "new"})) == {
        **args, "password": "new"}
    with pytest.raises(EditProblem, match="masked"):
        edited_arguments(args, [], _form({**shown, "password": MASKED + "x"}))


def test_an_in_place_edit_beside_the_unchanged_json_editor() -> None:
    """The page posts both: the JSON editor as shown and the field edited in place."""
    args = {"to": "ops@example.com", "subject": "S", "body": "write to ann@corp.example"}
    review = ["to", "subject"]
    form = {"edit.to": "boss@example.org", "edit.subject": "S",
            "arguments_json": as_json(shown_arguments(args, review)).replace("\n", "\r\n")}
    assert edited_arguments(args, review, form) == {**args, "to": "boss@example.org"}
    assert args["to"] == "ops@example.com"  # the real arguments are never changed in place
