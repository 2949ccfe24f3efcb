"""The schema dialect (turnstile.engine.schema_dialect) and the model settings
that choose it: what a grammar-compiling server is sent, table
by table, and every reference tool rendered as the wire carries it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from examples.support_desk import app as support_desk_app
from turnstile import ModelSettings, Service, ToolRegistry, tool
from turnstile.engine.errors import ConfigurationError
from turnstile.engine.schema_dialect import (
    KEPT,
    MAX_REF_DEPTH,
    MAX_REPEAT,
    grammar_safe_tool_schemas,
    wire_parameters,
    wire_tool,
)
from turnstile.engine.specs import ToolSpec
from turnstile.providers import wire_tools as wire_cache
from turnstile.providers.wire_tools import wire_tools
from turnstile.runtime.config import Settings
from turnstile.sales.app import build_sales_app
from turnstile.sales.documents import SALES_DOCUMENTS


def _obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": sorted(props)}


@pytest.mark.parametrize(("field", "sent"), [
    # Lengths above the bound are left out, named in the description.
    ({"type": "string", "maxLength": 2000},
     {"type": "string", "description": "at most 2000 characters"}),
    ({"type": "string", "maxLength": 1000, "minLength": 1},
     {"type": "string", "maxLength": 1000, "minLength": 1}),
    ({"type": "string", "minLength": 1500}, {"type": "string"}),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 5000},
     {"type": "array", "items": {"type": "string"}, "description": "at most 5000 items"}),
    # pattern, format, title, examples, default: out (format named in the description).
    ({"type": "string", "pattern": "^[A-Z]+$", "title": "Code", "examples": ["AB"],
      "default": "A", "description": "a code"}, {"type": "string", "description": "a code"}),
    ({"type": "string", "format": "date", "description": "first day"},
     {"type": "string", "description": "first day (format: date)"}),
    # Bounds stay on integers, leave numbers.
    ({"type": "integer", "minimum": 1, "maximum": 10},
     {"type": "integer", "minimum": 1, "maximum": 10}),
    ({"type": "number", "minimum": 0.0, "maximum": 1e12, "multipleOf": 0.01}, {"type": "number"}),
    ({"anyOf": [{"type": "string", "maxLength": 20000}, {"type": "null"}]},
     {"anyOf": [{"type": "string", "description": "at most 20000 characters"}, {"type": "null"}]}),
    ({"type": "string", "enum": ["a", "b"], "const": "a"},
     {"type": "string", "enum": ["a", "b"], "const": "a"}),
])
def test_grammar_dialect_keeps_what_a_grammar_compiles(field: dict[str, Any],
                                                       sent: dict[str, Any]) -> None:
    assert wire_parameters(_obj(x=field), "grammar") == _obj(x=sent)
    assert wire_parameters(_obj(x=field), "full") == _obj(x=field)  # as declared


def test_a_property_named_like_a_keyword_is_kept() -> None:
    schema = _obj(title={"type": "string", "title": "Title"},
                  pattern={"type": "string", "format": "uri"})
    assert wire_parameters(schema, "grammar") == _obj(
        title={"type": "string"}, pattern={"type": "string", "description": "format: uri"})


def test_refs_are_inlined_and_defs_go_away() -> None:
    schema = {"$defs": {"Line": _obj(sku={"type": "string", "pattern": "^S"},
                                     qty={"type": "integer", "minimum": 1})},
              "type": "object",
              "properties": {"lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
                             "first": {"allOf": [{"$ref": "#/$defs/Line"}],
                                       "description": "the first line"}},
              "required": ["lines"]}
    line = _obj(sku={"type": "string"}, qty={"type": "integer", "minimum": 1})
    assert wire_parameters(schema, "grammar") == {
        "type": "object",
        "properties": {"lines": {"type": "array", "items": line},
                       "first": {**line, "description": "the first line"}},
        "required": ["lines"]}


def test_a_recursive_ref_is_cut_at_the_depth_bound() -> None:
    schema = {"$defs": {"Node": {"type": "object", "properties": {
        "name": {"type": "string"}, "child": {"$ref": "#/$defs/Node"}}}},
        "$ref": "#/$defs/Node"}
    sent = wire_parameters(schema, "grammar")
    depth, node = 0, sent
    while node.get("properties", {}).get("child"):
        node, depth = node["properties"]["child"], depth + 1
    # The root's $ref is the first of MAX_REF_DEPTH inlined Nodes; the next is any value.
    assert depth + 1 == MAX_REF_DEPTH and node["properties"]["child"] == {}
    assert "$ref" not in json.dumps(sent) and "$defs" not in sent


def _walk(schema: Any, path: str = "") -> list[str]:
    """Every keyword of `schema` a grammar-compiling server may refuse."""
    bad: list[str] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                for name, sub in value.items():
                    bad += _walk(sub, f"{path}.{name}")
                continue
            if key not in KEPT:
                bad.append(f"{path}: {key}")
            if key in ("minLength", "maxLength", "minItems", "maxItems") and value > MAX_REPEAT:
                bad.append(f"{path}: {key}={value}")
            bad += _walk(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, item in enumerate(schema):
            bad += _walk(item, f"{path}[{i}]")
    return bad


REFERENCE_SERVICES = [*build_sales_app().services, *support_desk_app.services]


@pytest.mark.parametrize("service", REFERENCE_SERVICES, ids=lambda s: s.name)
def test_every_reference_tool_is_grammar_safe_on_the_wire(service: Service) -> None:
    rendered = grammar_safe_tool_schemas(service.spec(), "grammar")
    assert [t["function"]["name"] for t in rendered] == service.tools.names()
    for entry in rendered:
        assert _walk(entry["function"]["parameters"]) == [], entry["function"]["name"]
    # The full schema (what validates the arguments in the tool) is unchanged.
    full = grammar_safe_tool_schemas(service.spec(), "full")
    assert [t["function"]["parameters"] for t in full] == [t.spec.parameters
                                                          for t in service.tools]


def test_the_sales_limits_that_broke_llama_cpp_are_not_sent() -> None:
    (assistant, compact) = build_sales_app().services
    sent = {t["function"]["name"]: t["function"]["parameters"]
            for t in grammar_safe_tool_schemas(assistant.spec())}
    assert "maxLength" not in sent["createFollowUpTask"]["properties"]["note"]  # 2000
    assert "maxLength" not in sent["createEmailTask"]["properties"]["body"]  # 20000
    assert sent["createEmailTask"]["properties"]["body"]["description"] == (
        "at most 20000 characters")
    assert [t["function"]["name"] for t in grammar_safe_tool_schemas(compact.spec())] == [
        "querySalesData", "createEmailTask"]


@tool()
def lookup(key: str) -> str:
    """Look a key up."""
    return key


def test_tool_choice_applies_to_the_first_round_only() -> None:
    named = ModelSettings(tool_choice="lookup")
    assert named.choice_for(0, ["lookup"]) == {"type": "function",
                                               "function": {"name": "lookup"}}
    assert named.choice_for(1, ["lookup"]) == "auto"
    assert named.choice_for(0, ["other"]) == "auto"  # not offered: the model decides
    assert ModelSettings(tool_choice="required").choice_for(0, ["lookup"]) == "required"
    assert ModelSettings(tool_choice="required").choice_for(2, ["lookup"]) == "auto"
    assert ModelSettings().choice_for(0, ["lookup"]) == "auto"


def test_a_named_tool_choice_must_name_a_tool_of_the_service() -> None:
    Service(name="s", tools=ToolRegistry([lookup]), model=ModelSettings(tool_choice="lookup"))
    with pytest.raises(ConfigurationError, match="tool_choice"):
        Service(name="s", tools=ToolRegistry([lookup]), model=ModelSettings(tool_choice="nope"))


def test_the_dialect_setting_defaults_to_grammar_and_refuses_others() -> None:
    assert Settings.from_env({}).llm_schema_dialect == "grammar"
    assert Settings.from_env({"LLM_SCHEMA_DIALECT": "FULL"}).llm_schema_dialect == "full"
    with pytest.raises(ConfigurationError, match="LLM_SCHEMA_DIALECT"):
        Settings.from_env({"LLM_SCHEMA_DIALECT": "gbnf"})


def test_compact_prompt_settings_shape_step_5() -> None:
    with_docs = Service(name="d", tools=ToolRegistry([lookup]), documents=SALES_DOCUMENTS)
    assert with_docs.spec().pipeline.retriever is not None
    off = Service(name="d", tools=ToolRegistry([lookup]), documents=SALES_DOCUMENTS,
                  model=ModelSettings(documents=False))
    assert off.spec().pipeline.retriever is None
    lead = Service(name="d", tools=ToolRegistry([lookup]),
                   model=ModelSettings(retrieval_lead_in="Notes:"))
    assert lead.spec().pipeline.policy.retrieval_template == "{{message}}\n\nNotes:\n{{contents}}"
    assert lead.spec().model.retrieval_lead_in == "Notes:"


def test_wire_tools_renders_a_spec_once_and_again_when_it_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(wire_cache, "_wire_cache", {})
    spec = ToolSpec(name="find", description="Find rows",
                    parameters=_obj(q={"type": "string", "maxLength": 2000, "title": "Q"}))
    first = wire_tools([spec], "grammar")
    assert first == [wire_tool(spec, "grammar")]
    assert wire_tools([spec], "grammar")[0] is first[0]  # reused, not rendered again
    assert wire_tools([spec], "full") == [wire_tool(spec, "full")]  # per dialect
    # Changed in place (a nested bound, the description): rendered again.
    spec.parameters["properties"]["q"]["maxLength"] = 50
    assert wire_tools([spec], "grammar") == [wire_tool(spec, "grammar")]
    assert wire_tools([spec], "grammar")[0]["function"]["parameters"]["properties"]["q"] == {
        "type": "string", "maxLength": 50}
    spec.description = "Find rows fast"
    assert wire_tools([spec], "grammar")[0]["function"]["description"] == "Find rows fast"
    # Another spec (even one given the first's id after it is gone): its own schema.
    other = spec.model_copy(update={"parameters": _obj(n={"type": "integer", "maximum": 9})})
    assert wire_tools([other], "grammar") == [wire_tool(other, "grammar")]


def test_wire_tools_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(wire_cache, "_wire_cache", {})
    monkeypatch.setattr(wire_cache, "WIRE_CACHE_SIZE", 4)
    specs = [ToolSpec(name=f"t{i}", description="d", parameters=_obj(a={"type": "string"}))
             for i in range(10)]
    for spec in specs:
        assert wire_tools([spec], "grammar") == [wire_tool(spec, "grammar")]
        assert len(wire_cache._wire_cache) <= 4
    assert [key[0] for key in wire_cache._wire_cache] == [id(s) for s in specs[-4:]]


def test_tool_tokens_are_counted_once_and_again_when_a_spec_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from turnstile.activities import model_request

    monkeypatch.setattr(model_request, "_tool_tokens", {})
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return len(text)

    specs = [ToolSpec(name="a", description="one", parameters={"type": "object"}),
             ToolSpec(name="b", description="two", parameters={
                 "type": "object", "properties": {"x": {"type": "string"}}})]
    first = model_request.tool_tokens("m", specs, count)
    assert model_request.tool_tokens("m", specs, count) == first and len(counted) == 1
    specs[1].parameters["properties"]["x"]["maxLength"] = 10  # changed in place
    changed = model_request.tool_tokens("m", specs, count)
    assert changed > first and len(counted) == 2
    assert model_request.tool_tokens("other-model", specs, count) == changed
    assert len(counted) == 3  # another model's counter counts for itself
    assert model_request.tool_tokens("m", specs[:1], count) < changed
