"""Dynamic tool providers (docs/design.md, "Tool calling"): asked before each round, they may add
tools to a turn, never remove one the model has already seen.

Kept apart from `services` so provider implementations (the MCP toolsets in
`turnstile.runtime.mcp`) can build on it without importing the service registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from turnstile.runtime.tools import ToolRegistry


@dataclass(frozen=True)
class ProviderContext:
    conversation_id: str
    user_id: str
    state: dict[str, Any]  # merged `turnstile.state` of the conversation's tool results
    known: list[str]  # tools the model has already seen this turn


@dataclass
class ToolProvider:
    """A dynamic tool provider: offers tools from its catalogue according to
    the conversation's state. Asked before each round; it can only add tools.

    `refresh` (optional, async) is awaited by the worker before the catalogue
    is read, for providers whose catalogue lives elsewhere (an MCP server)."""

    name: str
    catalogue: ToolRegistry
    select: Callable[[ProviderContext], Iterable[str]]

    async def refresh(self) -> None:
        """Bring the catalogue up to date (nothing to do for a static catalogue)."""
