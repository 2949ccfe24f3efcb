"""MCP costs on the worker side: opening a session, listing tools, calling a
tool (schema check + `tools/call`), over stdio and streamable HTTP.

    .venv/bin/python -m bench.mcp               # 200 calls per server
    .venv/bin/python -m bench.mcp --calls 1000

Servers: the SDK-written test server (`tests.support.mcp_servers`) over stdio
(spawned by the session, as in a worker) and over streamable HTTP (its own
process), and `mcp-server-time` from PyPI over stdio. No Temporal: these are
the costs a turn's `resolve_tools` / `execute_tool` activities add on top of
an ordinary tool activity (bench/turns.py measures those).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.support.mcp_fixtures import Effects, HttpServer, stdio_server
from turnstile.runtime.mcp import MCPServer, MCPToolset
from turnstile.runtime.mcp.sessions import MCPConnection


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


async def measure(label: str, server: MCPServer, tool: str, raw_args: str, calls: int) -> None:
    conn = MCPConnection(server)
    toolset = MCPToolset(server, connection=conn)
    t0 = time.perf_counter()
    await conn.client()
    opened = time.perf_counter() - t0
    listings = []
    for _ in range(20):
        t0 = time.perf_counter()
        await toolset.refresh()
        listings.append(time.perf_counter() - t0)
    t = toolset.catalogue.get(tool)
    assert t is not None, tool
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        out = await t.invoke(None, t.parse_arguments(raw_args))  # type: ignore[arg-type]
        samples.append(time.perf_counter() - t0)
        assert out, "empty result"
    await conn.close()
    q = statistics.quantiles(samples, n=20)
    print(f"{label:<28} open {ms(opened)}  list p50 {ms(statistics.median(listings))}  "
          f"call p50 {ms(statistics.median(samples))}  p95 {ms(q[18])}  ({calls} calls, "
          f"{len(toolset.catalogue)} tools)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        effects = Effects(Path(tmp) / "effects.jsonl")
        await measure("test server, stdio", stdio_server(effects), "lookup", '{"key": "k"}',
                      args.calls)
        http = HttpServer(Path(tmp) / "http.log", effects).start()
        try:
            await measure("test server, streamable HTTP", MCPServer(name="remote", url=http.url),
                          "lookup", '{"key": "k"}', args.calls)
        finally:
            http.stop()
        time_server = MCPServer(name="time", command=[sys.executable, "-m", "mcp_server_time",
                                                      "--local-timezone", "UTC"])
        await measure("mcp-server-time, stdio", time_server, "get_current_time",
                      '{"timezone": "Europe/Paris"}', args.calls)


if __name__ == "__main__":
    asyncio.run(main())
