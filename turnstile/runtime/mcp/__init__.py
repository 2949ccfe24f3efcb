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

from turnstile.runtime.mcp.config import MCPServer, MCPToolPolicy, parse_mcp_servers
from turnstile.runtime.mcp.connection import MCPConnection, MCPUnavailable, connections
from turnstile.runtime.mcp.toolset import MCPTool, MCPToolset

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
