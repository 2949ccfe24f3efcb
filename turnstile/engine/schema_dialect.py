"""Tool schemas as the wire carries them, per schema dialect.

A tool's JSON schema (from its pydantic signature) is what validates its
arguments inside the tool, always, whatever is sent. What the model request
carries depends on the dialect:

- `"full"`: the schema as the tool declares it.
- `"grammar"` (the default): what a server that compiles tool schemas into a
  grammar (llama.cpp's `llama-server --jinja`, llama-cpp-python's
  `chatml-function-calling`) accepts. Measured: llama-server refuses every
  request whose schema has `maxLength: 2000` ("failed to parse grammar";
  1999 passes), llama-cpp-python crashes on 2000 and works at 1000. So:

  * only the keywords a grammar can express are kept (`KEPT`): types,
    properties, required, items, enum/const, anyOf/oneOf/allOf,
    descriptions, and bounds; `pattern`, `format`, `title`, `examples`,
    `default`, `multipleOf`, `not`, `if`/`then`/`else`... are left out;
  * `minLength`/`maxLength`/`minItems`/`maxItems` above `MAX_REPEAT` (1000)
    are left out (a length the model should know goes into the description:
    "at most 20000 characters"); a dropped `format` does too ("format: date");
  * `minimum`/`maximum` stay on integers only (a grammar bounds digits, not
    fractions);
  * local `$ref`s (`#/$defs/...`, `#/definitions/...`) are inlined, at most
    `MAX_REF_DEPTH` (3) deep; a deeper or recursive one becomes `{}` (any
    JSON value), and `$defs` go away;
  * an `allOf` of one schema (pydantic's wrapper for a described `$ref`) is
    merged into its parent.

Pure functions: no I/O. `grammar_safe_tool_schemas(spec)` renders every tool
of a service as the request's `tools` carries them (the provider keeps each
tool's rendering: turnstile.providers.wire_tools).
"""

from __future__ import annotations

from typing import Any

from turnstile.engine.model_settings import SchemaDialect
from turnstile.engine.specs import ServiceSpec, ToolSpec

# llama.cpp's grammar refuses repetitions of 2000 or more; llama-cpp-python
# crashed at 2000 and worked at 1000. Bounds above this are left out.
MAX_REPEAT = 1000
MAX_REF_DEPTH = 3
DEFAULT_DIALECT: SchemaDialect = "grammar"

# Keywords whose value is one schema / a list of schemas / a name -> schema map.
_ONE = ("items", "additionalProperties")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties",)
_LENGTHS = ("minLength", "maxLength", "minItems", "maxItems")
_INTEGER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# Everything else a grammar can express; any other keyword is left out.
KEPT = frozenset({"type", "required", "enum", "const", "description",
                  *_ONE, *_MANY, *_MAP, *_LENGTHS, *_INTEGER_BOUNDS})


def wire_parameters(schema: dict[str, Any], dialect: SchemaDialect) -> dict[str, Any]:
    """A tool's argument schema as `dialect` sends it."""
    if dialect == "full":
        return schema
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        found = schema.get(key)
        if isinstance(found, dict):
            defs.update({f"#/{key}/{name}": s for name, s in found.items()})
    rendered: dict[str, Any] = _grammar(schema, defs, 0)
    return rendered


def wire_tool(tool: ToolSpec, dialect: SchemaDialect) -> dict[str, Any]:
    """One entry of the request's `tools`, its parameters in `dialect`."""
    return {"type": "function", "function": {
        "name": tool.name, "description": tool.description,
        "parameters": wire_parameters(tool.parameters, dialect)}}


def grammar_safe_tool_schemas(spec: ServiceSpec,
                              dialect: SchemaDialect | None = None) -> list[dict[str, Any]]:
    """Every tool of `spec` as the request's `tools` carries it: `dialect`, or
    the service's `ModelSettings.schema_dialect`, or "grammar". Each entry is
    `{"type": "function", "function": {"name", "description", "parameters"}}`."""
    chosen = dialect or spec.model.schema_dialect or DEFAULT_DIALECT
    return [wire_tool(t, chosen) for t in spec.tools]


def _grammar(schema: Any, defs: dict[str, Any], depth: int) -> Any:
    if not isinstance(schema, dict):
        return schema  # `true`/`false` schemas pass as they are
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref)
        if target is None or depth >= MAX_REF_DEPTH:
            inlined: dict[str, Any] = {}
        else:
            inlined = dict(_grammar(target, defs, depth + 1))
        # Siblings of $ref (a description pydantic puts beside it) win.
        rest = _grammar({k: v for k, v in schema.items() if k != "$ref"}, defs, depth)
        return {**inlined, **rest}
    out: dict[str, Any] = {}
    hints: list[str] = []
    typ = schema.get("type")
    for key, value in schema.items():
        if key not in KEPT:
            if key == "format" and isinstance(value, str):
                hints.append(f"format: {value}")
            continue
        if key in _ONE:
            out[key] = _grammar(value, defs, depth)
        elif key in _MANY and isinstance(value, list):
            out[key] = [_grammar(v, defs, depth) for v in value]
        elif key in _MAP and isinstance(value, dict):
            out[key] = {name: _grammar(v, defs, depth) for name, v in value.items()}
        elif key in _LENGTHS:
            if isinstance(value, int) and value <= MAX_REPEAT:
                out[key] = value
            elif key in ("maxLength", "maxItems") and isinstance(value, int):
                hints.append(f"at most {value} {'characters' if key == 'maxLength' else 'items'}")
        elif key in _INTEGER_BOUNDS:
            if typ == "integer":
                out[key] = value
        else:
            out[key] = value
    all_of = out.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
        del out["allOf"]
        out = {**all_of[0], **out}
    if hints:
        text = "; ".join(hints)
        described = out.get("description")
        out["description"] = f"{described} ({text})" if described else text
    return out
