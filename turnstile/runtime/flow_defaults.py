"""A tool's information-flow rules as its spec carries them
(`ToolSpec.sensitive`; docs/information-flow.md): what `@tool(sensitive=...)`
declares, checked, or the defaults of an effectful tool.

An effectful tool — one with a compensation, `requires_approval=True` or an
approval condition — that declares nothing gets `review` for every
top-level argument whose values are text (a string, or a list or object of
strings; not a date, not a choice among fixed values): those are where an
injected recipient, URL or id travels. `sensitive={}` declares that no
argument is sensitive. A read-only tool has no rules unless it declares them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any

from turnstile.engine.flow import FLOW_RULES, FlowRule
from turnstile.engine.specs import ToolSpec

DEFAULT_RULE: FlowRule = "review"
_NOT_FREE_TEXT = frozenset({"date", "date-time", "time", "duration"})


def declaration_problem(tool_name: str, declared: Any, parameters: Iterable[str]) -> str | None:
    """What is wrong with `@tool(sensitive=...)` (None: nothing; the tool is
    refused at definition with these words)."""
    if not isinstance(declared, Mapping):
        return (f"tool {tool_name}: sensitive= takes a mapping of argument names to rules, "
                f"not {type(declared).__name__}")
    names = set(parameters)
    for name, rule in declared.items():
        if name not in names:
            return (f"tool {tool_name}: sensitive argument {name!r} is not a parameter "
                    f"(parameters: {sorted(names)})")
        if rule not in FLOW_RULES:
            return f"tool {tool_name}: rule {rule!r} for {name!r} is not one of " \
                   f"{', '.join(FLOW_RULES)}"
    return None


MAX_TRUSTED_KEYS = 32
MAX_KEY_CHARS = 200


def trusted_values_problem(tool_name: str, declared: Any, trusted_results: bool) -> str | None:
    """What is wrong with `@tool(trusted_values=...)`: True/False, or a
    non-empty sequence of result keys (None: nothing; the tool is refused at
    definition with these words). A lone string is refused: `"sender"` is
    not `("sender",)`, and a builder who wrote it meant one key or many."""
    if isinstance(declared, bool):
        if declared and trusted_results:
            return (f"tool {tool_name}: trusted_results=True already trusts all of its "
                    "results; trusted_values= says which whole values are trusted in "
                    "results that are otherwise not: give one of them")
        return None
    if isinstance(declared, str | bytes) or not isinstance(declared, Sequence | Set):
        return (f"tool {tool_name}: trusted_values= takes True (every value of its results) "
                "or a sequence of result keys such as (\"sender\", \"recipient\"), "
                f"not {declared!r}")
    keys = list(declared)
    if not keys or len(keys) > MAX_TRUSTED_KEYS:
        return (f"tool {tool_name}: trusted_values= names 1 to {MAX_TRUSTED_KEYS} result keys "
                f"(got {len(keys)})")
    for key in keys:
        if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_CHARS:
            return (f"tool {tool_name}: trusted_values= key {key!r} is not a key of a JSON "
                    f"object (a non-empty string of at most {MAX_KEY_CHARS} characters)")
    if trusted_results:
        return (f"tool {tool_name}: trusted_results=True already trusts all of its results; "
                "give trusted_values= or trusted_results=, not both")
    return None


def trusted_values(declared: Any) -> bool | list[str]:
    """The spec's form of a checked `trusted_values=` declaration."""
    if isinstance(declared, bool):
        return declared
    return list(dict.fromkeys(declared))


def effectful(spec: ToolSpec) -> bool:
    return bool(spec.compensation or spec.requires_approval or spec.approval_condition)


def effective(spec: ToolSpec, declared: dict[str, FlowRule] | None) -> dict[str, FlowRule]:
    """The rules the spec carries: the declaration, else an effectful tool's defaults."""
    if declared is not None:
        return dict(declared)
    if not effectful(spec):
        return {}
    schema = spec.parameters
    defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    return {name: DEFAULT_RULE for name, prop in props.items() if holds_text(prop, defs)}


def holds_text(schema: Any, defs: Mapping[str, Any], depth: int = 0) -> bool:
    """Whether values of this JSON schema can carry free text."""
    if depth > 8 or not isinstance(schema, dict):
        return False
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return holds_text(defs.get(ref.removeprefix("#/$defs/")), defs, depth + 1)
    if "enum" in schema or "const" in schema:
        return False
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds and schema.get("format") not in _NOT_FREE_TEXT:
        return True
    nested = [schema.get("items"), schema.get("additionalProperties"),
              *(schema.get("properties") or {}).values()]
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        nested.extend(schema.get(key) or [])
    return any(holds_text(n, defs, depth + 1) for n in nested)
