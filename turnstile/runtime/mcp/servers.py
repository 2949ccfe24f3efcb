"""MCP servers as configuration data (a service option, or the environment
variable TURNSTILE_MCP_SERVERS, a JSON list of these objects)."""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from turnstile.engine.errors import ConfigurationError
from turnstile.engine.flow import FLOW_RULES, FlowRule
from turnstile.engine.specs import DEFAULT_HEARTBEAT_SECONDS


class MCPToolPolicy(BaseModel):
    """A service's override of what one MCP tool's hints imply. Unset fields
    keep the hint-derived value."""

    model_config = ConfigDict(extra="forbid")

    requires_approval: bool | None = None
    retry_safe: bool | None = None  # safe to run twice: re-run after a lost worker
    read_only: bool | None = None  # declared read-only by the operator (no approval, retry-safe)
    timeout_seconds: float | None = None
    # Information-flow rules (docs/information-flow.md), as `@tool(sensitive=...,
    # trusted_results=...)` declares them: argument -> allow | review | refuse
    # ({}: none is sensitive; unset: a destructive tool's defaults), and whether
    # the tool's answers are trusted content (unset: untrusted); or, for an
    # answer that is JSON, which whole values of it are (`@tool(trusted_values=)`:
    # true for all, or the keys they sit under).
    sensitive: dict[str, FlowRule] | None = None
    trusted_results: bool | None = None
    trusted_values: bool | list[str] | None = None

    @field_validator("sensitive", mode="before")
    @classmethod
    def _known_rules(cls, declared: Any) -> Any:
        """An unknown rule is named, with the rules there are."""
        if isinstance(declared, dict):
            for name, rule in declared.items():
                if rule not in FLOW_RULES:
                    raise ValueError(f"sensitive: rule {rule!r} for argument {name!r} is not "
                                     f"one of {', '.join(FLOW_RULES)}")
        return declared


class MCPServer(BaseModel):
    """One MCP server: stdio (`command`) or streamable HTTP (`url`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    command: str | list[str] | None = None  # stdio: the command line that starts the server
    env: dict[str, str] = Field(default_factory=dict)  # stdio: extra environment of the server
    cwd: str | None = None  # stdio: working directory
    url: str | None = None  # streamable HTTP endpoint, e.g. http://127.0.0.1:9000/mcp
    headers_env: dict[str, str] = Field(default_factory=dict)  # HTTP header -> env variable
    services: list[str] | None = None  # None: every service of the worker
    prefix: str = ""  # prepended to the server's tool names (avoids clashes)
    timeout_seconds: float = 60.0  # one tool call (the activity's start-to-close)
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS  # a lost worker is noticed this soon
    tools: dict[str, MCPToolPolicy] = Field(default_factory=dict)  # per tool (server's name)
    # Believe the server's tool hints (readOnlyHint, destructiveHint, ...)? Only
    # for servers the operator trusts; otherwise every tool needs approval
    # unless `tools` declares it read-only.
    trust_hints: bool = False

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServer:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of command or url")
        if self.command is not None and not self.argv:
            raise ValueError(f"MCP server {self.name!r}: empty command")
        return self

    @property
    def argv(self) -> list[str]:
        if self.command is None:
            return []
        return shlex.split(self.command) if isinstance(self.command, str) else list(self.command)

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "streamable-http"

    def headers(self) -> dict[str, str]:
        """HTTP headers, read from the worker's environment when the session opens
        (so a secret never sits in configuration or history)."""
        out = {}
        for header, var in self.headers_env.items():
            value = os.environ.get(var)
            if value is None:
                raise ConfigurationError(
                    f"MCP server {self.name!r}: header {header!r} needs environment "
                    f"variable {var}, which is not set")
            out[header] = value
        return out

    def serves(self, service: str) -> bool:
        return self.services is None or service in self.services


def parse_mcp_servers(text: str | None) -> tuple[MCPServer, ...]:
    """TURNSTILE_MCP_SERVERS: a JSON list of server objects ("" or unset: none)."""
    if text is None or not text.strip():
        return ()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"TURNSTILE_MCP_SERVERS is not valid JSON: {exc}") from exc
    if not isinstance(raw, list):
        raise ConfigurationError("TURNSTILE_MCP_SERVERS must be a JSON list of server objects")
    try:
        servers = tuple(MCPServer.model_validate(item) for item in raw)
    except ValidationError as exc:
        raise ConfigurationError(f"TURNSTILE_MCP_SERVERS: {exc}") from exc
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"TURNSTILE_MCP_SERVERS names a server twice: {names}")
    return servers
