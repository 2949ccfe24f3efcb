"""MCP servers written with the official SDK (FastMCP-style `MCPServer`), run
as real processes: over stdio (`python -m tests.support.mcp_servers stdio`) or
streamable HTTP (`... http PORT`).

Tools cover every hint combination Turnstile maps to policy. Each run of a
tool appends one line to the file named by MCP_EFFECTS_FILE, so a test can
count how often the server really ran a tool (a re-run shows as two lines).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True)
IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True)
ADDITIVE = ToolAnnotations(read_only_hint=False, destructive_hint=False)


def _effect(tool: str, **fields: Any) -> None:
    path = os.environ.get("MCP_EFFECTS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": tool, "pid": os.getpid(), **fields}) + "\n")
            f.flush()


def build(name: str) -> MCPServer:
    server: MCPServer = MCPServer(name)

    @server.tool(annotations=READ_ONLY)
    def lookup(key: str) -> str:
        """Look a key up in the inventory (read-only)."""
        _effect("lookup", key=key)
        return json.dumps({"key": key, "value": f"value-of-{key}", "server": name})

    @server.tool(annotations=READ_ONLY)
    def slow_lookup(key: str, seconds: float = 3.0) -> str:
        """Look a key up slowly (read-only)."""
        _effect("slow_lookup", key=key)
        time.sleep(seconds)
        return f"slow value of {key}"

    @server.tool(annotations=IDEMPOTENT)
    def set_flag(flag: str, value: bool) -> str:
        """Set a flag to a value (idempotent)."""
        _effect("set_flag", flag=flag, value=value)
        return f"{flag} is now {value}"

    @server.tool(annotations=DESTRUCTIVE)
    def delete_record(record_id: int, seconds: float = 0.0) -> str:
        """Delete a record for good (destructive)."""
        _effect("delete_record", record_id=record_id)
        time.sleep(seconds)
        return f"record {record_id} deleted"

    @server.tool(annotations=ADDITIVE)
    def add_note(text: str) -> str:
        """Append a note (additive: neither read-only nor idempotent)."""
        _effect("add_note", text=text)
        return "noted"

    @server.tool()
    def mystery(x: int) -> str:
        """A tool without any hints."""
        _effect("mystery", x=x)
        return str(x * 2)

    @server.tool(annotations=READ_ONLY)
    def explode(reason: str = "the backend said no") -> str:
        """Always fails (the server reports isError)."""
        _effect("explode")
        raise ToolError(reason)

    @server.tool(annotations=READ_ONLY)
    def big_text(megabytes: float) -> str:
        """A result of the given size (read-only)."""
        return "x" * int(megabytes * 1024 * 1024)

    @server.tool(annotations=READ_ONLY)
    def whoami() -> str:
        """The server's process id."""
        return str(os.getpid())

    @server.tool(annotations=READ_ONLY)
    def contact(person: str) -> str:
        """A person's contact details (contains an e-mail address)."""
        _effect("contact", person=person)
        return f"{person}: {person.lower()}@example.com, +1 555 0100"

    return server


def serve_http(port: int) -> None:
    """Streamable HTTP on 127.0.0.1:port/mcp. With MCP_REQUIRED_TOKEN set, a
    request without `Authorization: Bearer <token>` is refused (401)."""
    import uvicorn
    from starlette.responses import PlainTextResponse
    from starlette.types import ASGIApp, Receive, Scope, Send

    app = build("remote").streamable_http_app()
    token = os.environ.get("MCP_REQUIRED_TOKEN")

    def guarded(inner: ASGIApp) -> ASGIApp:
        async def guard(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and token:
                auth = dict(scope["headers"]).get(b"authorization", b"").decode()
                if auth != f"Bearer {token}":
                    await PlainTextResponse("unauthorized", 401)(scope, receive, send)
                    return
            await inner(scope, receive, send)
        return guard

    uvicorn.run(guarded(app), host="127.0.0.1", port=port, log_level="warning")


def main(argv: list[str]) -> None:
    mode = argv[0] if argv else "stdio"
    if mode == "stdio":
        build("inventory").run("stdio")
    elif mode == "http":
        serve_http(int(argv[1]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: stdio | http PORT")


if __name__ == "__main__":
    main(sys.argv[1:])
