"""Tools from typed functions: schema, validation, registration."""

from __future__ import annotations

from datetime import date
from typing import Annotated

import pytest
from pydantic import Field

from turnstile.engine.errors import DuplicateToolError, TemplateVariableMissing, ToolArgumentError
from turnstile.engine.turn_rules import render_template
from turnstile.runtime.tools import ToolContext, ToolRegistry, tool


@tool(idempotent=True)
def lookup(ctx: ToolContext, day: date, limit: Annotated[int, Field(ge=1, le=10)] = 5) -> dict:
    """Look things up for a day."""
    return {"day": day.isoformat(), "limit": limit}


def test_schema_comes_from_the_signature() -> None:
    spec = lookup.spec
    assert spec.name == "lookup"
    assert spec.description == "Look things up for a day."
    assert spec.idempotent is True
    props = spec.parameters["properties"]
    assert set(props) == {"day", "limit"}  # the context is not a parameter
    assert props["day"]["format"] == "date"
    assert props["limit"]["maximum"] == 10
    assert spec.parameters["required"] == ["day"]
    assert spec.parameters["additionalProperties"] is False


@pytest.mark.parametrize(("raw", "fragment"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"day": "yesterday"}', "day"),
    ('{"day": "2026-01-01", "limit": 99}', "limit"),
    ('{"day": "2026-01-01", "sql": "DROP TABLE x"}', "sql"),
    ("{}", "day"),
])
def test_argument_errors_say_what_to_fix(raw: str, fragment: str) -> None:
    with pytest.raises(ToolArgumentError) as err:
        lookup.parse_arguments(raw)
    assert fragment in str(err.value)
    assert "lookup" in str(err.value)


def test_valid_arguments_parse() -> None:
    args = lookup.parse_arguments('{"day": "2026-01-02"}')
    assert args.day == date(2026, 1, 2) and args.limit == 5


def test_duplicate_names_fail_at_registration() -> None:
    @tool(name="lookup")
    def other() -> str:
        return "x"

    registry = ToolRegistry([lookup])
    with pytest.raises(DuplicateToolError, match="lookup"):
        registry.add(other)


def test_templates_fill_variables_and_name_missing_ones() -> None:
    filled = render_template("Hi {{ name }}, {{message}}", {"name": "Bo", "message": "m"})
    assert filled == "Hi Bo, m"
    with pytest.raises(TemplateVariableMissing, match="region"):
        render_template("Sales in {{region}}", {"message": "m"})
