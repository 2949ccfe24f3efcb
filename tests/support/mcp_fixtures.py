"""Real MCP servers for tests: the SDK-written servers of
`tests.support.mcp_servers` over stdio (started by the worker's session, as in
production) or streamable HTTP (a subprocess here), and `mcp-server-time`
from the package index."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import free_port, kill_group, port_open, spawn, wait_for
from turnstile.runtime.mcp import MCPServer

ROOT = Path(__file__).resolve().parents[2]


class Effects:
    """What the test servers really ran: one JSON line per tool run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def runs(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [r for r in rows if tool is None or r["tool"] == tool]


def stdio_server(effects: Effects, name: str = "inventory", **options: Any) -> MCPServer:
    """The SDK-written stdio server, started by whoever opens a session to it
    (our own test server: its hints are trusted unless a test says otherwise)."""
    options.setdefault("trust_hints", True)
    return MCPServer(name=name, command=[sys.executable, "-m", "tests.support.mcp_servers",
                                         "stdio"],
                     env={"PYTHONPATH": str(ROOT), "MCP_EFFECTS_FILE": str(effects.path)},
                     cwd=str(ROOT), **options)


class HttpServer:
    """The SDK-written server over streamable HTTP, as its own process."""

    def __init__(self, log: Path, effects: Effects, token: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log, self.effects, self.token = log, effects, token
        self.proc: Any = None

    def start(self) -> HttpServer:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MCP_EFFECTS_FILE": str(self.effects.path)}
        if self.token:
            env["MCP_REQUIRED_TOKEN"] = self.token
        self.proc = spawn([sys.executable, "-m", "tests.support.mcp_servers", "http",
                           str(self.port)], self.log, env=env, cwd=ROOT)
        wait_for(lambda: port_open(self.port), 30, f"MCP HTTP server on {self.port}")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path / "mcp-effects.jsonl")


@pytest.fixture
def mcp_http(tmp_path: Path, effects: Effects) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path / "mcp-http.log", effects, token="s3cret").start()
    yield server
    server.stop()
