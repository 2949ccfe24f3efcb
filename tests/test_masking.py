"""Masking works on parsed values, however the text was escaped."""

from __future__ import annotations

import json

import pytest

from turnstile.engine.masking import mask_any, mask_json_text, mask_text, mask_value

SEED = "zq-seed-7731@example.com"


@pytest.mark.parametrize("text", [
    json.dumps({"to": SEED}),                                  # plain JSON
    json.dumps({"to": SEED}, ensure_ascii=True).replace("@", "\\u0040"),  # escaped "@"
    '{"to": "' + "".join(f"\\u{ord(c):04x}" for c in SEED) + '"}',  # every char escaped
    json.dumps({"nested": [{"deeper": {"to": SEED}}]}),
    json.dumps(json.dumps({"to": SEED})),                      # JSON inside a JSON string
])
def test_an_address_is_masked_however_it_is_escaped(text: str) -> None:
    assert SEED not in text or "\\u" not in text  # the escaped forms really hide it
    assert SEED in _decoded(text)  # ... and really encode it, or the test is vacuous
    masked = mask_json_text(text)
    assert "zq-seed-7731" not in _decoded(masked)
    assert "z***@example.com" in _decoded(masked)


def _decoded(text: str) -> str:
    """Every string inside `text`, JSON inside strings decoded too."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, str):
        return _decoded(value)
    return json.dumps(value, ensure_ascii=False)


def test_sensitive_fields_are_replaced_whole() -> None:
    out = mask_value({"password": "hunter2", "Token": "abc", "ok": "fine", "n": 3})
    assert out == {"password": "***", "Token": "***", "ok": "fine", "n": 3}
    assert mask_value({"secretive": "x"}, sensitive={"secretive"}) == {"secretive": "***"}


def test_phones_keep_two_digits_and_dates_stay() -> None:
    assert mask_text("ring +1 (555) 123-4567") == "ring *********67"
    assert mask_text("on 2026-11-16") == "on 2026-11-16"
    assert mask_text("order 12345") == "order 12345"  # too short to be a phone


def test_plain_text_and_objects() -> None:
    assert mask_any(f"mail {SEED} now") == "mail z***@example.com now"
    assert mask_any({"to": [SEED, SEED]}) == {"to": ["z***@example.com"] * 2}
    assert mask_json_text("not json, " + SEED) == "not json, z***@example.com"


# Every spelling of an address the masker must see through ("addresses
# the masker misses"); the seed is what must disappear.
SPELLINGS = {
    "zq7idn": "zq7idn@ex\u0430mple.com",  # Cyrillic а in the domain
    "zq7quoted": '"zq7quoted"@evil.test',
    "zq7pct": "zq7pct%40example.com",
    "zq7html": "zq7html&#64;example.com",
    "zq7hex": "zq7hex&#x40;example.com",
    "zq7fw": "zq7fw\uff20example.com",
    "zq7json": "zq7json\\u0040example.com",
    "zq7uni": "zq7uni@b\u00fccher.de",
    "zq7fwall": "\uff5a\uff51\uff17\uff46\uff57\uff41\uff4c\uff4c\uff20example\uff0ecom",
}


@pytest.mark.parametrize("seed", sorted(SPELLINGS))
def test_every_spelling_of_an_address_is_masked(seed: str) -> None:
    text = f"please write to {SPELLINGS[seed]} today"
    masked = mask_text(text)
    assert seed not in masked and "zq7" not in masked.replace("z***", ""), masked
    assert "***@" in masked and masked.startswith("please write to ")
    nested = json.dumps({"args": json.dumps({"to": SPELLINGS[seed], "n": [1, 2]})})
    assert seed not in mask_json_text(nested)


def test_plain_text_and_numbers_are_left_alone() -> None:
    for text in ["sales over 50,000 last week", "2026-12-03", "a@b", "100% sure", "x&#65;y"]:
        assert mask_text(text) == text


def test_log_lines_are_masked_whoever_logs_them() -> None:
    import logging

    from turnstile.runtime.log_masking import MaskingFilter

    record = logging.LogRecord("sqlalchemy.engine", logging.WARNING, __file__, 1,
                               "insert failed: %s [%r]", ("boom", {"to": "zq7log@example.com"}),
                               None)
    assert MaskingFilter().filter(record)
    assert "zq7log" not in record.getMessage() and "z***@example.com" in record.getMessage()
