"""An MCP server's tools as ordinary Turnstile tools.

`MCPToolset` is a dynamic tool provider whose catalogue is the server's tool
listing; `MCPTool` is a `Tool` whose arguments are checked against the
server's `inputSchema` (an argument error the model can correct, before
anything runs) and whose invocation is one `tools/call` on the worker's
session. The activity around it (ledger, audit, approval, size handling) is
the same as for any other tool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from mcp import MCPError
from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    TextContent,
    TextResourceContents,
    Tool as MCPToolInfo,
)
from pydantic import BaseModel, ConfigDict

from turnstile.engine.errors import ConfigurationError, ToolArgumentError
from turnstile.engine.specs import ToolSpec
from turnstile.runtime import flow_defaults
from turnstile.runtime.mcp.policy import hint_policy
from turnstile.runtime.mcp.servers import MCPServer
from turnstile.runtime.mcp.sessions import MCPCallLost, MCPConnection, MCPUnavailable, connections
from turnstile.runtime.tool_providers import ProviderContext, ToolProvider
from turnstile.runtime.tools import (
    Tool,
    ToolContext,
    ToolExecutionError,
    ToolInterrupted,
    ToolRegistry,
    ToolResult,
    decode_arguments,
)

log = logging.getLogger(__name__)

_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_-]")


class MCPArguments(BaseModel):
    """Arguments already checked against the tool's JSON schema, kept as given."""

    model_config = ConfigDict(extra="allow")


async def _no_call(*_: Any, **__: Any) -> Any:
    raise AssertionError("MCP tools are invoked through MCPTool.invoke")


@dataclass
class MCPTool(Tool):
    server: MCPServer = field(kw_only=True)
    remote_name: str = field(kw_only=True)
    connection: MCPConnection = field(kw_only=True)
    validator: Draft202012Validator = field(kw_only=True)

    @classmethod
    def build(cls, server: MCPServer, info: MCPToolInfo, connection: MCPConnection) -> MCPTool:
        override = server.tools.get(info.name)
        policy = hint_policy(info.annotations, override, trusted=server.trust_hints)
        timeout = (override.timeout_seconds if override and override.timeout_seconds
                   else server.timeout_seconds)
        schema = dict(info.input_schema or {"type": "object"})
        schema.pop("title", None)
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise ConfigurationError(
                f"MCP server {server.name!r}: tool {info.name!r} has an invalid inputSchema: "
                f"{exc.message}") from exc
        description = info.description or (info.annotations.title if info.annotations else None)
        spec = ToolSpec(
            name=model_name(server, info.name),
            description=description or info.title or info.name,
            parameters=schema,
            idempotent=policy.retry_safe,
            repeatable=policy.read_only,  # a read may be asked again (the repeat breaker)
            requires_approval=policy.requires_approval,
            start_to_close_seconds=timeout,
            heartbeat_seconds=server.heartbeat_seconds,
            summary=f"mcp {server.name}/{info.name}",
        )
        # The operator's rules, else: a tool the server marks destructive waits
        # for a reviewer, shown where its text arguments came from
        # (docs/information-flow.md). Its answers are untrusted unless declared.
        declared = override.sensitive if override is not None else None
        if declared is not None:
            problem = flow_defaults.declaration_problem(
                spec.name, declared, (schema.get("properties") or {}).keys())
            if problem:
                raise ConfigurationError(f"MCP server {server.name!r}: {problem}")
        spec.sensitive = flow_defaults.effective(spec, declared)
        spec.trusted_results = bool(override is not None and override.trusted_results)
        vouched = override.trusted_values if override is not None else None
        if vouched is not None:
            problem = flow_defaults.trusted_values_problem(spec.name, vouched,
                                                           spec.trusted_results)
            if problem:
                raise ConfigurationError(f"MCP server {server.name!r}: {problem}")
            spec.trusted_values = flow_defaults.trusted_values(vouched)
        return cls(fn=_no_call, spec=spec, args_model=MCPArguments, takes_context=False,
                   server=server, remote_name=info.name, connection=connection,
                   validator=Draft202012Validator(schema))

    def parse_arguments(self, raw: str) -> BaseModel:
        data = decode_arguments(self.name, raw, self.spec.max_argument_bytes)
        problems = sorted(self.validator.iter_errors(data), key=lambda e: list(e.path))
        if problems:
            detail = "; ".join(
                f"{'.'.join(str(p) for p in e.path) or '(arguments)'}: {e.message}"
                for e in problems[:10])
            raise ToolArgumentError(f"invalid arguments for {self.name}: {detail}")
        return MCPArguments.model_validate(data)

    async def invoke(self, ctx: ToolContext, args: BaseModel) -> Any:
        arguments = args.model_dump()
        try:
            result = await self.connection.call_tool(self.remote_name, arguments,
                                                     self.spec.start_to_close_seconds)
        except MCPUnavailable as exc:  # never reached the server: retry per the policy
            raise ToolExecutionError(str(exc)) from exc
        except MCPCallLost as exc:
            if self.spec.idempotent:
                raise ToolExecutionError(str(exc)) from exc
            raise ToolInterrupted(str(exc)) from exc
        except MCPError as exc:  # the server refused the request (a protocol error)
            raise ToolExecutionError(f"MCP server {self.server.name!r} answered {self.remote_name} "
                                     f"with error {exc.code}: {exc}") from exc
        text = result_text(result)
        if result.is_error:  # the tool ran and failed: the model reads why
            return ToolResult(content=text or f"{self.remote_name} reported an error",
                              is_error=True)
        return text


def model_name(server: MCPServer, remote_name: str) -> str:
    """The name the model calls: the server's prefix + its tool name, with
    characters model APIs refuse in function names (OpenAI: [A-Za-z0-9_-])
    replaced by "_" (the call still goes out under the server's own name)."""
    return server.prefix + _NOT_IN_NAMES.sub("_", remote_name)


def result_text(result: CallToolResult) -> str:
    """What the model reads: text blocks as they are, other blocks described."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, EmbeddedResource) and isinstance(block.resource,
                                                                TextResourceContents):
            parts.append(block.resource.text)
        else:
            kind = getattr(block, "mime_type", None) or block.type
            parts.append(f"[{block.type} content ({kind}) omitted]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


class MCPToolset(ToolProvider):
    """A dynamic provider offering every tool an MCP server lists.

    `refresh` lists the server's tools (worker side; the turn records the
    result of `turnstile.resolve_tools`, so a replay never asks again). A tool
    the server stops listing stays in the catalogue: providers only add."""

    def __init__(self, server: MCPServer, *, connection: MCPConnection | None = None,
                 taken: Callable[[MCPToolset], set[str]] | None = None) -> None:
        super().__init__(name=f"mcp:{server.name}", catalogue=ToolRegistry(),
                         select=self._select)
        self.server = server
        self.connection = connection or connections.get(server)
        self.taken = taken or (lambda _: set())
        self.listed = False
        self._lock = asyncio.Lock()
        self._warned: set[str] = set()

    def _select(self, ctx: ProviderContext) -> list[str]:
        return self.catalogue.names()

    async def refresh(self) -> None:
        async with self._lock:
            listing = await self.connection.list_tools()
            taken = self.taken(self)
            tools = {t.name: t for t in self.catalogue}
            seen: dict[str, str] = {}
            for info in listing:
                t = MCPTool.build(self.server, info, self.connection)
                if seen.setdefault(t.name, info.name) != info.name:
                    raise ConfigurationError(
                        f"MCP server {self.server.name!r}: tools {seen[t.name]!r} and "
                        f"{info.name!r} both become {t.name!r} for the model")
                if t.name in taken:
                    raise ConfigurationError(
                        f"MCP server {self.server.name!r} lists tool {info.name!r}, but the "
                        f"service already has a tool named {t.name!r}; give the server a "
                        "`prefix`")
                tools[t.name] = t
            self.catalogue = ToolRegistry(tools.values())
            self.listed = True
            self._warn_unlisted({info.name for info in listing})

    def _warn_unlisted(self, listed: set[str]) -> None:
        """Policies for tools the server does not list: a typo, or a tool it
        does not offer yet (it may later). Said once per tool, in the logs."""
        for name in sorted(set(self.server.tools) - listed - self._warned):
            self._warned.add(name)
            log.warning("MCP server %r does not list tool %r, which its configuration's "
                        "`tools` names (a typo, or not offered yet); the policy applies if "
                        "it appears", self.server.name, name)
