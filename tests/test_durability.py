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
from turnstile.contract import WORKFLOW_TYPE, CallStatus, TurnInput, TurnResult, TurnStatus
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

