"""Tool schemas as a model request sends them, each rendered once.

Activity-side only (it keeps state between requests): the engine's
`schema_dialect.wire_tool` is the pure rendering; this keeps its result.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from turnstile.engine.model_settings import SchemaDialect
from turnstile.engine.schema_dialect import wire_tool
from turnstile.engine.specs import ToolSpec

# A model call renders the same tools every round (0.1 ms per sales request,
# bench.micro model-request): each spec's entry is kept, keyed by the spec
# object and the dialect, and reused only while the spec still reads the
# same (name, description, and its parameters equal to a copy taken when it
# was rendered), so a spec changed in place or a new object at a reused id
# is rendered again. At most WIRE_CACHE_SIZE entries (the oldest go first).
WIRE_CACHE_SIZE = 512
_Entry = tuple[str, str, dict[str, Any], dict[str, Any]]
_wire_cache: dict[tuple[int, str], _Entry] = {}


def wire_tools(tools: Iterable[ToolSpec], dialect: SchemaDialect) -> list[dict[str, Any]]:
    """`wire_tool` of each tool, rendered once while the spec is unchanged.
    The entries are shared between requests: read them, never change them."""
    out = []
    for tool in tools:
        key = (id(tool), dialect)
        entry = _wire_cache.get(key)
        if (entry is None or entry[0] != tool.name or entry[1] != tool.description
                or entry[2] != tool.parameters):
            entry = (tool.name, tool.description, copy.deepcopy(tool.parameters),
                     wire_tool(tool, dialect))
            _wire_cache.pop(key, None)
            while len(_wire_cache) >= WIRE_CACHE_SIZE:
                del _wire_cache[next(iter(_wire_cache))]
            _wire_cache[key] = entry
        out.append(entry[3])
    return out
