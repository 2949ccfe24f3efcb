"""MCP calls across a lost worker, and an MCP server from the package index
configured as a user would: `python worker.py` subprocesses configured only
by the environment (TURNSTILE_MCP_SERVERS), SIGKILLed mid-call; the stdio
servers are the worker's children and die with it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.support.mcp_fixtures import Effects, stdio_server
from tests.support.temporal_server import DevServer
from tests.support.worker_process import WorkerProcess
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    CallStatus,
    PendingApproval,
    TurnInput,
    TurnResult,
    TurnStatus,
)
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


def worker_env(server: DevServer, task_queue: str, tmp_path: Path, llm_url: str,
               effects: Effects) -> dict[str, str]:
    inventory = stdio_server(effects, heartbeat_seconds=2, services=["test"])
    servers = [
        json.loads(inventory.model_dump_json(exclude_defaults=True)),
        # From PyPI, configured exactly as docs/mcp.md shows (found on PATH).
        {"name": "time", "command": "python -m mcp_server_time --local-timezone UTC",
         "trust_hints": True},
    ]
    return {"TEMPORAL_ADDRESS": server.address, "TURNSTILE_TASK_QUEUE": task_queue,
            "DATABASE_URL": f"sqlite:///{tmp_path}/t.db", "LLM_BASE_URL": llm_url,
            "TURNSTILE_MCP_SERVERS": json.dumps(servers),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


async def start(client: Client, task_queue: str, wf_id: str) -> WorkflowHandle[Any, TurnResult]:
    return await client.start_workflow(
        WORKFLOW_TYPE, TurnInput(conversation_id=f"c-{wf_id}", user_id="alice", message="go",
                                 service="test", variables={"team": "ops"}),
        id=wf_id, task_queue=task_queue, result_type=TurnResult)


def tool_result(fake_llm: FakeOpenAIServer, call_id: str) -> str:
    return next(m["content"] for m in fake_llm.requests[-1]["messages"]
                if m["role"] == "tool" and m["tool_call_id"] == call_id)


async def kill_mid_call(client: Client, task_queue: str, tmp_path: Path, env: dict[str, str],
                        wf_id: str, effects: Effects, tool: str,
                        approve: str | None = None) -> TurnResult:
    first = WorkerProcess(tmp_path / "worker1.log", env).start()
    try:
        handle = await start(client, task_queue, wf_id)
        for _ in range(300):
            if approve and await handle.query("pending_approvals",
                                              result_type=list[PendingApproval]):
                await handle.signal("approve", ApproveSignal(tool_call_id=approve,
                                                             reviewer="carol"))
                approve = None
            if effects.runs(tool):
                break
            await asyncio.sleep(0.1)
        else:
            raise TimeoutError(f"{tool} never started")
    finally:
        first.kill()
    second = WorkerProcess(tmp_path / "worker2.log", env).start()
    try:
        return await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        second.stop()


async def test_read_only_call_is_rerun_after_the_worker_is_killed(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, effects: Effects) -> None:
    fake_llm.script(tool_reply(("k1", "slow_lookup", {"key": "a", "seconds": 4})),
                    text_reply("done"))
    env = worker_env(temporal_server, task_queue, tmp_path, fake_llm.url, effects)
    result = await kill_mid_call(client, task_queue, tmp_path, env, f"mcp-ro-{task_queue}",
                                 effects, "slow_lookup")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
    runs = effects.runs("slow_lookup")
    assert len(runs) == 2 and runs[0]["pid"] != runs[1]["pid"]  # re-run by a new server
    assert tool_result(fake_llm, "k1") == "slow value of a"


async def test_destructive_call_is_reported_interrupted_never_rerun(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, effects: Effects) -> None:
    fake_llm.script(tool_reply(("k2", "delete_record", {"record_id": 9, "seconds": 4})),
                    text_reply("checked"))
    env = worker_env(temporal_server, task_queue, tmp_path, fake_llm.url, effects)
    wf_id = f"mcp-destructive-{task_queue}"
    result = await kill_mid_call(client, task_queue, tmp_path, env, wf_id, effects,
                                 "delete_record", approve="k2")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.INTERRUPTED]
    assert len(effects.runs("delete_record")) == 1
    assert "may or may not have taken effect" in tool_result(fake_llm, "k2")
    audit = AuditLog(Database(env["DATABASE_URL"])).rows(wf_id)
    assert [(r.tool_name, r.status) for r in audit] == [("delete_record", "FAILED")]
    assert audit[0].error_message.startswith("interrupted; effect unknown")


async def test_mcp_server_time_from_the_package_index(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, effects: Effects) -> None:
    fake_llm.script(tool_reply(("t1", "get_current_time", {"timezone": "Europe/Paris"})),
                    tool_reply(("t2", "convert_time", {"source_timezone": "UTC",
                                                       "time": "12:00",
                                                       "target_timezone": "Asia/Tokyo"})),
                    text_reply("it is late in Tokyo"))
    env = worker_env(temporal_server, task_queue, tmp_path, fake_llm.url, effects)
    worker = WorkerProcess(tmp_path / "worker.log", env).start()
    try:
        handle = await start(client, task_queue, f"mcp-time-{task_queue}")
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        worker.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 2
    now = json.loads(tool_result(fake_llm, "t1"))
    assert now["timezone"] == "Europe/Paris" and now["datetime"][-6:] in ("+01:00", "+02:00")
    assert json.loads(tool_result(fake_llm, "t2"))["target"]["datetime"].endswith(
        "T21:00:00+09:00")
    history = await handle.fetch_history()
    summaries = [json.loads(e.user_metadata.summary.data) for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name
                 == "turnstile.execute_tool"]
    assert summaries == ["mcp time/get_current_time", "mcp time/convert_time"]
