"""MCP servers on the worker side, against real servers written with the SDK:
hints become policy, arguments are checked against `inputSchema` before the
server runs anything, sessions are reused and reopened, configuration is data."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
from mcp.types import ToolAnnotations

from tests.support.mcp_fixtures import Effects, HttpServer, stdio_server
from tests.support.waiting import wait_until
from turnstile.engine.errors import ConfigurationError, ToolArgumentError
from turnstile.runtime.config import Settings
from turnstile.runtime.mcp import MCPServer, MCPToolPolicy, MCPToolset, parse_mcp_servers
from turnstile.runtime.mcp.policy import hint_policy
from turnstile.runtime.mcp.sessions import MCPConnection, MCPUnavailable
from turnstile.runtime.plugins import load_services
from turnstile.runtime.services import Service
from turnstile.runtime.tools import (
    ToolExecutionError,
    ToolInterrupted,
    ToolRegistry,
    ToolResult,
    tool,
)


@pytest.mark.parametrize(("hints", "retry_safe", "approval"), [
    (ToolAnnotations(read_only_hint=True), True, False),
    (ToolAnnotations(read_only_hint=True, destructive_hint=True), True, False),
    (ToolAnnotations(idempotent_hint=True, destructive_hint=False), True, False),
    (ToolAnnotations(idempotent_hint=True), True, True),  # destructive by default
    (ToolAnnotations(destructive_hint=True), False, True),
    (ToolAnnotations(destructive_hint=False), False, False),
    (ToolAnnotations(title="no behaviour hints"), False, True),
    (None, False, True),
])
def test_hints_map_to_policy(hints: ToolAnnotations | None, retry_safe: bool,
                             approval: bool) -> None:
    p = hint_policy(hints, trusted=True)
    assert (p.retry_safe, p.requires_approval) == (retry_safe, approval)
    # From a server not configured as trusted, no hint changes anything.
    untrusted = hint_policy(hints)
    assert (untrusted.retry_safe, untrusted.requires_approval, untrusted.read_only) == (
        False, True, False)


def test_only_the_operator_declares_an_untrusted_servers_tool_read_only() -> None:
    read_only = ToolAnnotations(read_only_hint=True)
    declared = hint_policy(read_only, MCPToolPolicy(read_only=True))
    assert (declared.retry_safe, declared.requires_approval, declared.read_only) == (
        True, False, True)
    assert hint_policy(None, MCPToolPolicy(read_only=True)).requires_approval is False


def test_a_service_overrides_the_hints_per_tool() -> None:
    destructive = ToolAnnotations(destructive_hint=True)
    no_approval = MCPToolPolicy(requires_approval=False)
    assert hint_policy(destructive, no_approval, trusted=True).requires_approval is False
    assert hint_policy(destructive, MCPToolPolicy(retry_safe=True), trusted=True).retry_safe is True
    read_only = ToolAnnotations(read_only_hint=True)
    approval = MCPToolPolicy(requires_approval=True)
    assert hint_policy(read_only, approval, trusted=True).requires_approval


@pytest.fixture
async def toolset(effects: Effects) -> AsyncIterator[MCPToolset]:
    ts = MCPToolset(stdio_server(effects), connection=MCPConnection(stdio_server(effects)))
    yield ts
    await ts.connection.close()


async def call(ts: MCPToolset, name: str, raw: str) -> object:
    t = ts.catalogue.get(name)
    assert t is not None, name
    return await t.invoke(None, t.parse_arguments(raw))  # type: ignore[arg-type]



async def test_listing_becomes_tool_specs_with_hint_policy(toolset: MCPToolset) -> None:
    await toolset.refresh()
    specs = {t.name: t.spec for t in toolset.catalogue}
    policy = {n: (s.idempotent, s.requires_approval) for n, s in specs.items()}
    assert policy["lookup"] == (True, False)
    assert policy["set_flag"] == (True, False)
    assert policy["delete_record"] == (False, True)
    assert policy["add_note"] == (False, False)
    assert policy["mystery"] == (False, True)
    assert specs["lookup"].summary == "mcp inventory/lookup"
    assert specs["lookup"].parameters["required"] == ["key"]
    assert specs["lookup"].description.startswith("Look a key up")
    assert toolset.select(None) == list(specs)  # type: ignore[arg-type]


async def test_an_untrusted_servers_hints_change_nothing(effects: Effects) -> None:
    """The same server, not configured as trusted: its readOnlyHint no longer
    skips approval; a tool the operator declares read-only does."""
    server = stdio_server(effects, trust_hints=False,
                          tools={"add_note": MCPToolPolicy(read_only=True)})
    ts = MCPToolset(server, connection=MCPConnection(server))
    try:
        await ts.refresh()
        specs = {t.name: t.spec for t in ts.catalogue}
    finally:
        await ts.connection.close()
    assert {n: s.requires_approval for n, s in specs.items()} == {
        "lookup": True, "set_flag": True, "delete_record": True, "add_note": False,
        "mystery": True, **{n: True for n in specs if n not in
                            {"lookup", "set_flag", "delete_record", "add_note", "mystery"}}}
    assert specs["add_note"].idempotent and not specs["lookup"].idempotent


async def test_arguments_checked_against_input_schema_before_the_server_runs(
        toolset: MCPToolset, effects: Effects) -> None:
    await toolset.refresh()
    lookup = toolset.catalogue.get("lookup")
    assert lookup is not None
    for raw, expected in [('{"key": 7}', "key: 7 is not of type 'string'"),
                          ("{}", "'key' is a required property"),
                          ('["key"]', "must be a JSON object"),
                          ('{"key": ', "not valid JSON")]:
        with pytest.raises(ToolArgumentError, match=expected):
            lookup.parse_arguments(raw)
    assert effects.runs() == []
    assert "value-of-k1" in str(await call(toolset, "lookup", '{"key": "k1"}'))
    assert [r["key"] for r in effects.runs("lookup")] == ["k1"]


async def test_is_error_result_is_an_error_result(toolset: MCPToolset) -> None:
    await toolset.refresh()
    out = await call(toolset, "explode", '{"reason": "disk on fire"}')
    assert isinstance(out, ToolResult) and out.is_error
    assert "disk on fire" in str(out.content)


async def test_session_reused_across_calls_and_reopened_after_the_server_dies(
        toolset: MCPToolset) -> None:
    await toolset.refresh()
    pid = await call(toolset, "whoami", "{}")
    assert await call(toolset, "whoami", "{}") == pid
    assert toolset.connection.opened == 1
    os.kill(int(str(pid)), signal.SIGKILL)
    await wait_until(lambda: not toolset.connection.open, what="the session saw its server die")
    new_pid = await call(toolset, "whoami", "{}")
    assert new_pid != pid and toolset.connection.opened == 2


@pytest.mark.parametrize(("name", "raised"), [("slow_lookup", ToolExecutionError),
                                              ("delete_record", ToolInterrupted)])
async def test_server_dying_mid_call(toolset: MCPToolset, effects: Effects, name: str,
                                     raised: type[Exception]) -> None:
    """A call in flight when the server dies may have run: a retry-safe tool
    raises a retryable execution error, any other is reported interrupted."""
    await toolset.refresh()
    args = '{"key": "a", "seconds": 5}' if name == "slow_lookup" else \
        '{"record_id": 1, "seconds": 5}'
    running = asyncio.create_task(call(toolset, name, args))
    runs = await wait_until(lambda: effects.runs(name), what=f"{name} started")
    os.kill(runs[0]["pid"], signal.SIGKILL)
    with pytest.raises(raised, match="session closed|cut off"):
        await asyncio.wait_for(running, 10)


async def test_http_server_with_headers_from_the_environment(
        tmp_path, effects: Effects, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    http = HttpServer(tmp_path / "http.log", effects, token="t0ken").start()
    server = MCPServer(name="remote", url=http.url,
                       headers_env={"Authorization": "TEST_REMOTE_AUTH"})
    try:
        monkeypatch.setenv("TEST_REMOTE_AUTH", "Bearer wrong")
        refused = MCPConnection(server)
        with pytest.raises(MCPUnavailable, match="could not be reached"):
            await refused.list_tools()
        monkeypatch.setenv("TEST_REMOTE_AUTH", "Bearer t0ken")
        ts = MCPToolset(server, connection=MCPConnection(server))
        await ts.refresh()
        assert ts.catalogue.get("set_flag") is not None
        assert await call(ts, "set_flag", '{"flag": "f", "value": true}') == "f is now True"
        assert effects.runs("set_flag")[0]["value"] is True
        await ts.connection.close()
        monkeypatch.delenv("TEST_REMOTE_AUTH")
        with pytest.raises(ConfigurationError, match="TEST_REMOTE_AUTH"):
            await MCPConnection(server).list_tools()
    finally:
        http.stop()


async def test_unreachable_server_is_reported_as_unavailable() -> None:
    gone = MCPConnection(MCPServer(name="gone", url="http://127.0.0.1:9/mcp"))
    with pytest.raises(MCPUnavailable, match="'gone'.*could not be reached"):
        await gone.list_tools()
    missing = MCPConnection(MCPServer(name="nope", command="/nonexistent/mcp-server"))
    with pytest.raises(MCPUnavailable, match="could not be reached"):
        await missing.list_tools()


def test_configuration_from_the_environment() -> None:
    servers = parse_mcp_servers(
        '[{"name": "time", "command": "python -m mcp_server_time", "services": ["a"]},'
        ' {"name": "files", "url": "http://127.0.0.1:9000/mcp",'
        '  "headers_env": {"Authorization": "FILES_TOKEN"}}]')
    assert [s.transport for s in servers] == ["stdio", "streamable-http"]
    assert servers[0].argv == ["python", "-m", "mcp_server_time"]
    assert servers[0].serves("a") and not servers[0].serves("b") and servers[1].serves("b")
    assert parse_mcp_servers("") == ()
    for bad, why in [("{", "not valid JSON"), ('{"name": "x"}', "JSON list"),
                     ('[{"name": "x"}]', "exactly one of command or url"),
                     ('[{"name": "x", "command": "a", "url": "http://b"}]', "exactly one"),
                     ('[{"name": "x", "command": "a", "colour": 1}]', "colour"),
                     ('[{"name": "x", "command": "a"}, {"name": "x", "command": "b"}]',
                      "twice")]:
        with pytest.raises(ConfigurationError, match=why):
            parse_mcp_servers(bad)


def test_environment_route_adds_servers_to_the_services_it_names() -> None:
    def svc(name: str) -> Service:
        return Service(name=name, tools=ToolRegistry())

    env = ('[{"name": "t", "command": "x", "services": ["b"]},'
           ' {"name": "all", "command": "y"}]')
    registry = load_services(Settings(mcp_servers=env), [svc("a"), svc("b")])
    assert [s.name for s in registry.get("a").mcp_servers] == ["all"]
    assert [s.name for s in registry.get("b").mcp_servers] == ["t", "all"]
    assert registry.get("b").spec().dynamic_tools
    with pytest.raises(ConfigurationError, match="unknown service"):
        load_services(Settings(mcp_servers='[{"name": "t", "command": "x", '
                                           '"services": ["zzz"]}]'), [svc("a")])


@tool(idempotent=True)
def lookup(key: str) -> str:
    """A static tool whose name an MCP server also uses."""
    return key


async def test_a_name_clash_fails_loudly_and_a_prefix_resolves_it(effects: Effects) -> None:
    clash = Service(name="s", tools=ToolRegistry([lookup]), mcp_servers=[stdio_server(effects)])
    with pytest.raises(ConfigurationError, match="give the server a `prefix`"):
        await clash.refresh_providers()
    ok = Service(name="s", tools=ToolRegistry([lookup]),
                 mcp_servers=[stdio_server(effects, prefix="inv_")])
    await ok.refresh_providers()
    inv_lookup = ok.tool("inv_lookup")
    assert inv_lookup is not None and ok.tool("lookup") is lookup
    assert inv_lookup.spec.summary == "mcp inventory/lookup"
    assert "value-of-z" in str(await inv_lookup.invoke(None, inv_lookup.parse_arguments(  # type: ignore[arg-type]
        '{"key": "z"}')))
    from turnstile.runtime.mcp import connections
    await connections.close_all()


def test_model_facing_names_are_safe_for_model_apis() -> None:
    from turnstile.runtime.mcp.toolset import model_name

    server = MCPServer(name="files", command="x", prefix="fs_")
    assert model_name(server, "read_file") == "fs_read_file"
    assert model_name(server, "files.read/v2") == "fs_files_read_v2"


async def test_a_worker_that_never_listed_the_server_lists_it_before_reviewing_a_call(
        tmp_path, effects: Effects) -> None:  # type: ignore[no-untyped-def]
    """The turn's resolve_tools may have run on another worker: review_call
    (before an approval) finds the MCP tool by listing the server first."""
    from temporalio.testing import ActivityEnvironment

    from turnstile.activities import Runtime
    from turnstile.activities.review import ReviewActivities
    from turnstile.engine.activity_io import ReviewCallInput
    from turnstile.engine.messages import ToolCall
    from turnstile.runtime.mcp import connections
    from turnstile.runtime.services import ServiceRegistry

    service = Service(name="s", tools=ToolRegistry(), mcp_servers=[stdio_server(effects)])
    rt = Runtime.build(Settings.from_env({"DATABASE_URL": f"sqlite:///{tmp_path}/t.db"}),
                       ServiceRegistry([service]))
    review = ReviewActivities(rt)
    env = ActivityEnvironment()  # review_call heartbeats: it runs in an activity context

    def req(args: str) -> ReviewCallInput:
        return ReviewCallInput(service="s", call=ToolCall(id="x", name="delete_record",
                                                          arguments=args))

    try:
        bad = await env.run(review.review_call, req('{"record_id": "seven"}'))
        assert not bad.valid and "'seven' is not of type 'integer'" in bad.error
        assert (await env.run(review.review_call, req('{"record_id": 7}'))).valid
        assert effects.runs() == []  # reviewing never runs the tool
    finally:
        await connections.close_all()
        await rt.provider.aclose()
