"""The Temporal CLI commands of the README and docs/operating.md, run as
written against a real dev server: start a turn with plain JSON, list turns
waiting for approval, query, signal approve, read the result and the history."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

from temporalio.client import Client

from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker
from turnstile.runtime.devstack import temporal_binary
from turnstile.sales.planner import demo_planner
from turnstile.sales.seed import seed
from turnstile.sales.service import build_sales_service
from turnstile.stores.db import Database
from turnstile.stores.schema import ensure_schema

ROOT = Path(__file__).resolve().parents[1]
TODAY = date(2026, 11, 25)
MESSAGE = ("Find customers whose sales last week exceeded 50,000 and email ops@example.com "
           "to follow up")


async def temporal(server: DevServer, *args: str, check: bool = True) -> str:
    """`temporal ARGS... --address ...` in a subprocess; its stdout ("" on failure
    when not checked)."""
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(), *args, "--address", server.address,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await proc.communicate()
    if check:
        assert proc.returncode == 0, f"temporal {' '.join(args)}: {err.decode()}"
    return out.decode() if proc.returncode == 0 else ""


async def test_readme_cli_flow(client: Client, temporal_server: DevServer, task_queue: str,
                               tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/sales.db"
    db = Database(url)
    ensure_schema(db)
    seed(db, rows=2000, today=TODAY)
    wf = f"turn-cli-{task_queue}"
    async with running_worker(client, task_queue, url, [build_sales_service()],
                              provider=demo_planner(today=lambda: TODAY)):
        turn = {"conversation_id": f"c-{task_queue}", "user_id": "alice", "message": MESSAGE}
        await temporal(temporal_server, "workflow", "start", "--task-queue", task_queue,
                       "--type", "AgentTurn", "--workflow-id", wf, "--input", json.dumps(turn))
        pending: list[dict] = []
        for _ in range(200):
            # Until its first workflow task has run, a new turn cannot answer queries.
            out = await temporal(temporal_server, "workflow", "query", "--workflow-id", wf,
                                 "--name", "pending_approvals", "--output", "json", check=False)
            pending = json.loads(out)["queryResult"][0] if out else []
            if pending:
                break
            await asyncio.sleep(0.05)
        [p] = pending
        assert p["tool_name"] == "createEmailTask" and p["deadline"] > p["requested_at"]
        listed = ""
        for _ in range(100):  # visibility is eventually consistent
            listed = await temporal(temporal_server, "workflow", "list", "--query",
                                    f'TurnstilePendingApprovals > 0 AND WorkflowId = "{wf}"')
            if wf in listed:
                break
            await asyncio.sleep(0.1)
        assert wf in listed
        status = json.loads(await temporal(temporal_server, "workflow", "query", "--workflow-id",
                                           wf, "--name", "status", "--output", "json"))
        assert status["queryResult"][0]["step"] == "awaiting_approval"
        await temporal(temporal_server, "workflow", "signal", "--workflow-id", wf, "--name",
                       "approve", "--input",
                       json.dumps({"tool_call_id": p["tool_call_id"], "reviewer": "bob"}))
        result = await temporal(temporal_server, "workflow", "result", "--workflow-id", wf,
                                "--output", "json")
    body = json.loads(result)
    turn_result = body["result"] if "result" in body else body
    assert turn_result["status"] == "completed"
    assert [c["name"] for c in turn_result["tool_calls"]] == [
        "querySalesData", "createFollowUpTask", "createEmailTask"]
    shown = await temporal(temporal_server, "workflow", "show", "--workflow-id", wf)
    assert shown.count("ActivityTaskScheduled") >= 6  # model calls and tool calls, each one


async def test_starter_status_and_pending(client: Client, temporal_server: DevServer,
                                          task_queue: str, tmp_path) -> None:
    """`python starter.py run --no-follow`, then `pending` and `approve` by id."""
    url = f"sqlite:///{tmp_path}/sales.db"
    db = Database(url)
    ensure_schema(db)
    seed(db, rows=2000, today=TODAY)
    env_args = {"TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": task_queue,
                "DATABASE_URL": url}
    env = {**os.environ, **env_args}

    codes: list[int] = []

    async def starter(*args: str, check: bool = True) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "starter.py"), *args, env=env, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await proc.communicate()
        codes.append(proc.returncode or 0)
        if check:
            assert proc.returncode == 0, err.decode()
        return out.decode() if proc.returncode == 0 or not check else ""

    wf = f"turn-starter-{task_queue}"
    async with running_worker(client, task_queue, url, [build_sales_service()],
                              provider=demo_planner(today=lambda: TODAY)):
        out = await starter("run", MESSAGE, "--workflow-id", wf, "--no-follow")
        assert f"started {wf}" in out and "/namespaces/default/workflows/" in out
        pending: list = []
        for _ in range(200):
            # Until its first workflow task has run, a new turn cannot answer queries.
            pending = json.loads(await starter("pending", wf, check=False) or "[]")
            if pending:
                break
            await asyncio.sleep(0.05)
        call = pending[0]["tool_call_id"]
        # The requester, respelled, is refused with the reason; nothing says "sent".
        out = await starter("approve", wf, call, "--reviewer", "ALICE", check=False)
        assert codes[-1] == 1
        assert f"approve refused for {call}: " in out and "requested this call" in out
        out = await starter("approve", wf, call, "--reviewer", "carol")
        assert f"{pending[0]['tool_name']} {call} approved by carol at " in out
        out = await starter("reject", wf, call, "--reviewer", "dave", check=False)
        assert codes[-1] == 1 and f"reject refused for {call}: " in out
        handle = client.get_workflow_handle(wf)
        await handle.result()
        status = json.loads(await starter("status", wf))
    assert status["step"] == "completed"
    assert [c["status"] for c in status["tool_calls"]] == ["completed"] * 3
