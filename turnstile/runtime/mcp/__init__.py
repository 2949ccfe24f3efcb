"""MCP servers as tool providers.

A service lists MCP servers as data (`MCPServer`, also from the environment
variable TURNSTILE_MCP_SERVERS); each becomes a `MCPToolset`, a dynamic tool
provider whose catalogue is the server's tool listing. Every MCP tool is an
ordinary `Tool` of the registry, so calls go through the same activity,
ledger, audit, approval and argument-error path as any other tool; the tool's
annotations (hints) become its policy (`policy.hint_policy`).

Sessions live in the worker process (`MCPConnection`): opened on first use,
reused across turns, reopened after the server dies. Workflow code never sees
them: it only sees the recorded tool specs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from turnstile.extras import require_extra
from turnstile.runtime.mcp.servers import MCPServer, MCPToolPolicy, parse_mcp_servers

if TYPE_CHECKING:
    from turnstile.runtime.mcp.sessions import MCPConnection, MCPUnavailable, connections
    from turnstile.runtime.mcp.toolset import MCPTool, MCPToolset

# The MCP client library takes ~0.7 s to import: the sessions and toolsets are
# imported on first use (a service with an MCP server, a worker that has one),
# not by every CLI command and worker that imports the service registry.
_LAZY = {"MCPConnection": "sessions", "MCPUnavailable": "sessions",
         "connections": "sessions", "MCPTool": "toolset", "MCPToolset": "toolset"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_extra("mcp", "MCP servers (turnstile.runtime.mcp)")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)

__all__ = [
    "MCPConnection",
    "MCPServer",
    "MCPTool",
    "MCPToolPolicy",
    "MCPToolset",
    "MCPUnavailable",
    "connections",
    "parse_mcp_servers",
]
