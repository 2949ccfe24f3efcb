"""MCP tools in real turns: real dev server, in-process worker, real MCP
servers (SDK-written, over stdio and streamable HTTP), scripted model over
HTTP. Assertions are on what the model received, the turn result, the
history (activity summaries), the audit rows and what the servers really ran."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support.mcp_fixtures import Effects, HttpServer, stdio_server
from tests.support.services import echo
from tests.support.turns import running_worker, wait_pending
from tests.support.waiting import wait_until
from turnstile.engine.contract import (
    ApproveSignal,
    CallStatus,
    RejectSignal,
    TurnProgress,
    TurnStatus,
)
from turnstile.runtime.mcp import MCPServer, MCPToolPolicy, connections
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.stores.audit import AuditLog
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.workflows import AgentTurn


def mcp_service(*servers: MCPServer) -> Service:
    return Service(name="test", system_prompt="You help {{team}}.",
                   tools=ToolRegistry([echo]), mcp_servers=list(servers))


def db_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path}/t.db"


def tool_messages(request: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}


async def activities(handle: WorkflowHandle, name: str) -> list[tuple[str, int]]:
    """(Web UI summary, attempt that ended it) of each activity of that type."""
    history = await handle.fetch_history()
    scheduled = {e.event_id: e for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name == name}
    attempt = {e.activity_task_started_event_attributes.scheduled_event_id:
               e.activity_task_started_event_attributes.attempt for e in history.events
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED}
    return [(json.loads(e.user_metadata.summary.data), attempt.get(i, 0))
            for i, e in scheduled.items()]


async def test_stdio_tools_join_the_turn_named_audited_and_replayable(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,  # type: ignore[no-untyped-def]
        effects: Effects) -> None:
    fake_llm.script(tool_reply(("c1", "lookup", {"key": "bob@example.com"}),
                               ("c2", "echo", {"text": "hi"})),
                    tool_reply(("c3", "lookup", {"key": "k2"})),
                    text_reply("done"))
    server = stdio_server(effects)
    async with running_worker(client, task_queue, db_url(tmp_path), [mcp_service(server)],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("look it up")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
        # One session served three listings and two calls.
        assert connections.get(server).opened == 1
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [(c.name, c.status) for c in result.tool_calls] == [
        ("lookup", CallStatus.COMPLETED), ("echo", CallStatus.COMPLETED),
        ("lookup", CallStatus.COMPLETED)]
    # The model saw the server's tools with their schemas next to the static one.
    offered = {t["function"]["name"]: t["function"] for t in fake_llm.requests[0]["tools"]}
    assert {"echo", "lookup", "delete_record", "explode"} <= set(offered)
    assert offered["lookup"]["parameters"]["properties"]["key"]["type"] == "string"
    told = tool_messages(fake_llm.requests[-1])
    assert '"value": "value-of-bob@example.com"' in told["c1"] and "value-of-k2" in told["c3"]
    # Each MCP call is its own activity, named by server and tool in the Web UI.
    assert await activities(handle, "turnstile.execute_tool") == [
        ("mcp inventory/lookup", 1), ("echo", 1), ("mcp inventory/lookup", 1)]
    assert len(await activities(handle, "turnstile.resolve_tools")) == 3  # before each round
    # Audited like any tool, masking included.
    rows = {r.tool_name + ":" + r.input_params: r.status for r in audit}
    assert rows == {'lookup:{"key": "b***@example.com"}': "COMPLETED",
                    'echo:{"text": "hi"}': "COMPLETED", 'lookup:{"key": "k2"}': "COMPLETED"}
    assert [r["key"] for r in effects.runs("lookup")] == ["bob@example.com", "k2"]
    # A replay rebuilds the turn from the recorded listing: the server is not asked.
    history = await handle.fetch_history()
    replay = await Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter) \
        .replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None
    assert len(effects.runs()) == 2


async def test_argument_errors_and_is_error_results_go_back_to_the_model(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,  # type: ignore[no-untyped-def]
        effects: Effects) -> None:
    fake_llm.script(tool_reply(("a1", "lookup", {"key": 5}),
                               ("a2", "explode", {"reason": "disk on fire"})),
                    tool_reply(("a3", "lookup", {"key": "5"})),
                    text_reply("ok"))
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [mcp_service(stdio_server(effects))],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("try")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [
        CallStatus.INVALID_ARGUMENTS, CallStatus.FAILED, CallStatus.COMPLETED]
    assert [c.is_error for c in result.tool_calls] == [True, True, False]
    told = tool_messages(fake_llm.requests[1])
    assert "key: 5 is not of type 'string'" in told["a1"]
    assert "disk on fire" in told["a2"]
    # Bad arguments never reached the server; the failing tool ran once, not retried.
    assert [r["key"] for r in effects.runs("lookup")] == ["5"]
    assert len(effects.runs("explode")) == 1
    assert [a for _, a in await activities(handle, "turnstile.execute_tool")] == [1, 1, 1]
    # a1 and a2 ran concurrently in one round: their audit rows may start in either order.
    rows = [(r.tool_name, r.status) for r in audit]
    assert sorted(rows[:2]) == [("explode", "FAILED"), ("lookup", "FAILED")]
    assert rows[2:] == [("lookup", "COMPLETED")]


async def test_destructive_and_unhinted_tools_wait_for_approval(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,  # type: ignore[no-untyped-def]
        effects: Effects) -> None:
    server = stdio_server(effects, tools={"add_note": MCPToolPolicy(requires_approval=True),
                                          "set_flag": MCPToolPolicy(requires_approval=True)})
    fake_llm.script(tool_reply(("d1", "delete_record", {"record_id": 7}),
                               ("m1", "mystery", {"x": 2}),
                               ("n1", "add_note", {"text": "hello"}),
                               ("r1", "lookup", {"key": "free"})),
                    text_reply("done"))
    async with running_worker(client, task_queue, db_url(tmp_path), [mcp_service(server)],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("clean up")
        pending = await wait_pending(handle, 3)
        await wait_until(lambda: effects.runs("lookup"), what="the read-only call ran")
        assert sorted(p.tool_name for p in pending) == ["add_note", "delete_record", "mystery"]
        assert effects.runs("lookup")  # the read-only call did not wait
        assert not effects.runs("delete_record")
        await handle.signal("approve", ApproveSignal(tool_call_id="d1", reviewer="carol"))
        await handle.signal("reject", RejectSignal(tool_call_id="m1", reviewer="carol",
                                                   reason="unknown effect"))
        await handle.signal("approve", ApproveSignal(tool_call_id="n1", reviewer="carol"))
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [
        CallStatus.COMPLETED, CallStatus.REJECTED, CallStatus.COMPLETED, CallStatus.COMPLETED]
    assert [r["record_id"] for r in effects.runs("delete_record")] == [7]
    assert not effects.runs("mystery")
    assert "rejected by carol" in tool_messages(fake_llm.requests[-1])["m1"]


async def test_streamable_http_server_with_a_header_from_the_environment(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,  # type: ignore[no-untyped-def]
        effects: Effects, mcp_http: HttpServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_MCP_AUTH", "Bearer s3cret")
    server = MCPServer(name="remote", url=mcp_http.url, trust_hints=True,
                       headers_env={"Authorization": "TEST_MCP_AUTH"})
    fake_llm.script(tool_reply(("h1", "set_flag", {"flag": "ready", "value": True})),
                    text_reply("flag set"))
    async with running_worker(client, task_queue, db_url(tmp_path), [mcp_service(server)],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("set it")
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.tool_calls[0].status == CallStatus.COMPLETED
    assert tool_messages(fake_llm.requests[-1])["h1"] == "ready is now True"
    assert await activities(handle, "turnstile.execute_tool") == [("mcp remote/set_flag", 1)]
    assert [r["flag"] for r in effects.runs("set_flag")] == ["ready"]


async def test_unreachable_servers_are_retried_then_reported(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,  # type: ignore[no-untyped-def]
        effects: Effects, mcp_http: HttpServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server down at listing time: resolve_tools is retried, then the round
    goes on without its tools (the turn's events say so). A server that dies
    before a call: the call is retried by Temporal, then reported to the model."""
    monkeypatch.setenv("TEST_MCP_AUTH", "Bearer s3cret")
    down = MCPServer(name="down", url="http://127.0.0.1:9/mcp")
    remote = MCPServer(name="remote", url=mcp_http.url, trust_hints=True,
                       headers_env={"Authorization": "TEST_MCP_AUTH"})

    def kill_server_then_call(_: dict[str, Any]) -> dict[str, Any]:
        mcp_http.stop()
        return tool_reply(("u1", "lookup", {"key": "k"}))

    fake_llm.script(kill_server_then_call, text_reply("could not look it up"))
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [mcp_service(down, remote)], llm_url=fake_llm.url) as turns:
        handle = await turns.start("look")
        result = await handle.result()
        progress = await handle.query("status", result_type=TurnProgress)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [a for _, a in await activities(handle, "turnstile.resolve_tools")][0] == 3
    unavailable = [e.detail for e in progress.events if e.step == "tools_unavailable"]
    assert unavailable and "mcp:down" in unavailable[0] and "could not be reached" in \
        unavailable[0]
    offered = {t["function"]["name"] for t in fake_llm.requests[0]["tools"]}
    assert "lookup" in offered  # the reachable server's tools joined
    assert result.tool_calls[0].status == CallStatus.FAILED
    assert await activities(handle, "turnstile.execute_tool") == [("mcp remote/lookup", 3)]
    told = tool_messages(fake_llm.requests[-1])["u1"]
    assert "lookup failed after its retries" in told and "remote" in told
    assert not effects.runs("lookup")


async def test_a_large_mcp_result_gets_the_same_size_handling(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,  # type: ignore[no-untyped-def]
        effects: Effects) -> None:
    mb = 1024 * 1024
    fake_llm.script(tool_reply(("b1", "big_text", {"megabytes": 3})), text_reply("big"))
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [mcp_service(stdio_server(effects))],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("make it big", conversation="c-mcp-big")
        result = await handle.result()
        stored = MemoryStore(turns.rt.db).messages("c-mcp-big")
    assert result.status == TurnStatus.COMPLETED, result.error
    big = next(m for m in stored if m.tool_call_id == "b1")
    assert big.content == "x" * (3 * mb)  # whole in memory, above Temporal's 2 MiB limit
    assert tool_messages(fake_llm.requests[-1])["b1"].startswith("x" * 1000)
    history = await handle.fetch_history()  # the history holds a bounded preview
    assert max(e.ByteSize() for e in history.events) < 64 * 1024
    assert result.tool_calls[0].result_preview == "x" * 399 + "…"


async def test_one_session_serves_many_turns_and_is_reopened_after_the_server_dies(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,  # type: ignore[no-untyped-def]
        effects: Effects) -> None:
    server = stdio_server(effects)
    pids = []
    async with running_worker(client, task_queue, db_url(tmp_path), [mcp_service(server)],
                              llm_url=fake_llm.url) as turns:
        for i in range(3):
            fake_llm.script(tool_reply((f"w{i}", "whoami", {})), text_reply("ok"))
            result = await turns.run("who", conversation=f"c-who-{i}")
            assert result.status == TurnStatus.COMPLETED, result.error
            pids.append(int(tool_messages(fake_llm.requests[-1])[f"w{i}"]))
            if i == 0:
                os.kill(pids[0], signal.SIGKILL)  # the server dies between turns
                await wait_until(lambda: not connections.get(server).open,
                                 what="the session saw its server die")
        opened = connections.get(server).opened
    assert pids[1] != pids[0] and pids[2] == pids[1]
    assert opened == 2
