"""SIGKILL the worker while a tool runs; a new worker finishes the turn and the
tool's side effect exists exactly once."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client

from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
from tests.support.services import side_effects
from tests.support.temporal_server import DevServer
from tests.support.worker_process import WorkerProcess
from turnstile.audit import AuditLog
from turnstile.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    CallStatus,
    PendingApproval,
    TurnInput,
    TurnResult,
    TurnStatus,
)
from turnstile.db import Database


async def _wait_for_effect(db: Database, key_prefix: str, timeout: float = 30) -> None:
    for _ in range(int(timeout / 0.1)):
        if side_effects(db, key_prefix):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the tool never started")


@pytest.mark.parametrize(("tool", "expected"), [
    # idempotent: re-run on the new worker, its own key makes the write happen once
    ("slowUpsert", CallStatus.COMPLETED),
    # not safe to run twice: never re-run blindly; the model is told it was interrupted
    ("slowWrite", CallStatus.INTERRUPTED),
])
async def test_worker_killed_mid_tool(client: Client, temporal_server: DevServer, task_queue: str,
                                      tmp_path, fake_llm: FakeLLM, tool: str,
                                      expected: CallStatus) -> None:
    db_url = f"sqlite:///{tmp_path}/t.db"
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": task_queue,
           "DATABASE_URL": db_url, "LLM_BASE_URL": fake_llm.url}
    fake_llm.script(tool_reply(("call-k", tool, {"note": "once", "seconds": 4})),
                    text_reply("done"))
    db = Database(db_url)
    first = WorkerProcess(tmp_path / "worker1.log", env).start()
    try:
        wf_id = f"kill-{tool}-{task_queue}"
        handle = await client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id="c-kill", user_id="alice", message="go",
                                     service="test", variables={"team": "ops"}),
            id=wf_id, task_queue=task_queue, result_type=TurnResult)
        await _wait_for_effect(db, wf_id)
        first.kill()
    finally:
        first.kill()
    second = WorkerProcess(tmp_path / "worker2.log", env).start()
    try:
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        second.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [expected]
    assert len(side_effects(db, wf_id)) == 1
    # What the model was told about the call in its next request:
    tool_msg = fake_llm.requests[-1]["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "call-k"
    if expected == CallStatus.INTERRUPTED:
        assert "may or may not have taken effect" in tool_msg["content"]
    else:
        assert '"written": "once"' in tool_msg["content"]



async def _wait(predicate, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.1)):
        if await predicate():
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("condition not reached")


async def test_worker_killed_while_waiting_for_approval(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path,
        fake_llm: FakeLLM) -> None:
    db_url = f"sqlite:///{tmp_path}/t.db"
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": task_queue,
           "DATABASE_URL": db_url, "LLM_BASE_URL": fake_llm.url}
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob", "amount": 3})),
                    text_reply("paid"))
    first = WorkerProcess(tmp_path / "worker1.log", env).start()
    wf_id = f"kill-approval-{task_queue}"
    try:
        handle = await client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id="c-ka", user_id="alice", message="pay",
                                     service="test", variables={"team": "ops"}),
            id=wf_id, task_queue=task_queue, result_type=TurnResult)

        async def pending() -> bool:
            return bool(await handle.query("pending_approvals", result_type=list[PendingApproval]))

        await _wait(pending)
    finally:
        first.kill()
    # No worker: the approval is still recorded by the server.
    await handle.signal("approve", ApproveSignal(tool_call_id="p1", reviewer="carol"))
    second = WorkerProcess(tmp_path / "worker2.log", env).start()
    try:
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        second.stop()
    assert result.status == TurnStatus.COMPLETED
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
    assert len(side_effects(Database(db_url), wf_id)) == 1


async def test_worker_killed_during_compensation(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path,
        fake_llm: FakeLLM) -> None:
    db_url = f"sqlite:///{tmp_path}/t.db"
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": task_queue,
           "DATABASE_URL": db_url, "LLM_BASE_URL": fake_llm.url}
    fake_llm.script(tool_reply(("r1", "slowUndoReserve", {"item": "hall"})),
                    tool_reply(("m1", "mustSucceed", {})))
    db = Database(db_url)
    first = WorkerProcess(tmp_path / "worker1.log", env).start()
    wf_id = f"kill-undo-{task_queue}"
    try:
        handle = await client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id="c-ku", user_id="alice", message="book",
                                     service="test", variables={"team": "ops"}),
            id=wf_id, task_queue=task_queue, result_type=TurnResult)

        async def undoing() -> bool:
            return any(e["note"] == "CANCELLING" for e in side_effects(db, wf_id))

        await _wait(undoing)
    finally:
        first.kill()
    second = WorkerProcess(tmp_path / "worker2.log", env).start()
    try:
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        second.stop()
    assert result.status == TurnStatus.ROLLED_BACK
    assert result.tool_calls[0].status == CallStatus.ROLLED_BACK
    assert [e["note"] for e in side_effects(db, wf_id)] == ["CANCELLED"]
    assert [r["status"] for r in AuditLog(db).rows(wf_id) if r["tool_name"] == "slowUndoReserve"] \
        == ["ROLLED_BACK"]
