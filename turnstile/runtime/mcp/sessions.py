"""One MCP session per server per worker process.

The SDK's `Client` holds anyio task groups, which must be entered and left by
the same task; so each session is owned by a long-lived task that opens it,
waits until asked to close, and closes it. Activities (other tasks on the
worker's event loop) use the open session concurrently. A session whose
transport broke (the server died, the HTTP endpoint went away) is dropped and
reopened on the next use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import CallToolResult, Tool
from mcp.types.jsonrpc import CONNECTION_CLOSED, REQUEST_TIMEOUT

from turnstile.engine.errors import ConfigurationError, MCPServerUnavailable
from turnstile.runtime.mcp.servers import MCPServer

log = logging.getLogger("turnstile.mcp")

CONNECT_TIMEOUT_SECONDS = 30.0
MAX_LIST_PAGES = 100


class MCPUnavailable(MCPServerUnavailable):
    """The session could not be opened: the request never reached the server."""


class MCPCallLost(MCPServerUnavailable):
    """The transport failed while a call was in flight: it may have run."""


class MCPConnection:
    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self.opened = 0  # sessions opened so far (a reopen after a crash counts)

    # -- session lifecycle ---------------------------------------------------------
    def _target(self) -> Any:
        s = self.server
        if s.command is not None:
            argv = s.argv
            return StdioServerParameters(command=argv[0], args=argv[1:], env=dict(s.env) or None,
                                         cwd=s.cwd)
        assert s.url is not None
        return s.url

    @contextlib.asynccontextmanager
    async def _open_client(self) -> AsyncIterator[Client]:
        s = self.server
        if s.url is not None and s.headers_env:
            headers = s.headers()
            async with create_mcp_http_client(headers=headers) as http, \
                    Client(streamable_http_client(s.url, http_client=http)) as client:
                yield client
        else:
            async with Client(self._target()) as client:
                yield client

    async def _own(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        try:
            async with self._open_client() as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting opener or logged
            if not ready.done():
                ready.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("MCP server %r: session ended: %s", self.server.name, exc)
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
        finally:
            if self._owner is asyncio.current_task():  # not a session already replaced
                self._client = None

    @property
    def open(self) -> bool:
        """A session is open and has not seen its transport close."""
        return (self._client is not None and self._owner is not None
                and not self._owner.done() and not _transport_closed(self._client))

    async def client(self) -> Client:
        """The open session, opened (or reopened) if needed."""
        async with self._lock:
            if self._client is not None and self.open:
                return self._client
            await self._drop()
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[Client] = loop.create_future()
            self._stop = asyncio.Event()
            self._owner = asyncio.create_task(self._own(ready, self._stop),
                                              name=f"mcp-session-{self.server.name}")
            try:
                self._client = await asyncio.wait_for(asyncio.shield(ready),
                                                      CONNECT_TIMEOUT_SECONDS)
            except ConfigurationError:
                await self._drop()
                raise
            except Exception as exc:  # the transport's own errors: OSError, HTTP, protocol
                await self._drop()
                raise MCPUnavailable(
                    f"MCP server {self.server.name!r} ({self.server.transport}) could not be "
                    f"reached: {_describe(exc)}") from exc
            self.opened += 1
            log.info("MCP server %r: session open (%s)", self.server.name, self.server.transport)
            return self._client

    async def _drop(self) -> None:
        owner, self._owner, self._client = self._owner, None, None
        if owner is None:
            return
        if self._stop is not None:
            self._stop.set()
        try:
            await asyncio.wait_for(owner, 10)
        except Exception as exc:  # already logged by the owner
            log.debug("MCP server %r: close: %s", self.server.name, _describe(exc))

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

    async def _broken(self, client: Client) -> None:
        """`client` failed: drop it, unless another call already replaced it."""
        async with self._lock:
            if self._client is client:
                await self._drop()

    # -- requests ----------------------------------------------------------------------
    async def list_tools(self) -> list[Tool]:
        client = await self.client()
        tools: list[Tool] = []
        cursor: str | None = None
        try:
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    return tools
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                await self._broken(client)
                raise MCPUnavailable(f"MCP server {self.server.name!r}: the session closed "
                                     "while listing its tools") from exc
            raise MCPServerUnavailable(f"MCP server {self.server.name!r} refused to list its "
                                       f"tools: error {exc.code}: {exc}") from exc
        except Exception as exc:
            await self._broken(client)
            raise MCPUnavailable(f"MCP server {self.server.name!r}: listing its tools failed: "
                                 f"{_describe(exc)}") from exc
        raise MCPServerUnavailable(
            f"MCP server {self.server.name!r}: tool listing exceeds {MAX_LIST_PAGES} pages")

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        timeout_seconds: float | None = None) -> CallToolResult:
        client = await self.client()  # MCPUnavailable: the call never left this worker
        try:
            return await client.call_tool(name, arguments, read_timeout_seconds=timeout_seconds)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise MCPCallLost(f"MCP server {self.server.name!r}: no answer to {name} within "
                                  f"{timeout_seconds} s") from exc
            if exc.code != CONNECTION_CLOSED:
                raise
            await self._broken(client)
            raise MCPCallLost(f"MCP server {self.server.name!r}: the session closed while "
                              f"{name} was running") from exc
        except Exception as exc:
            await self._broken(client)
            raise MCPCallLost(f"MCP server {self.server.name!r}: the call to {name} was cut "
                              f"off: {_describe(exc)}") from exc


def _transport_closed(client: Client) -> bool:
    """Whether the session's transport has already closed (the server died).

    Checked before each use so that a request is never sent on a dead session:
    a call that fails there provably never reached the server. The SDK (2.3)
    keeps this on its dispatcher without a public accessor; if that changes,
    this reads False and a dead session is noticed by the request instead."""
    dispatcher = getattr(client.session, "_dispatcher", None)
    return bool(getattr(dispatcher, "_closed", False))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Connections:
    """The worker's sessions, one per server configuration."""

    def __init__(self) -> None:
        self._by_server: dict[str, MCPConnection] = {}

    def get(self, server: MCPServer) -> MCPConnection:
        key = server.model_dump_json()
        conn = self._by_server.get(key)
        if conn is None:
            conn = self._by_server[key] = MCPConnection(server)
        return conn

    async def close_all(self) -> None:
        for conn in list(self._by_server.values()):
            await conn.close()


# The process-wide pool: services built before the worker share sessions.
connections = Connections()

