"""Log lines from a real worker process: TURNSTILE_LOG_FORMAT=json gives one
JSON object per line (with the turn's workflow id where the SDK adds it),
and addresses are masked in them whoever logs."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from temporalio.client import Client

from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
from tests.support.temporal_server import DevServer
from tests.support.worker_process import WorkerProcess
from turnstile.engine.contract import WORKFLOW_TYPE, TurnInput, TurnResult, TurnStatus


async def test_json_log_lines(client: Client, temporal_server: DevServer, tmp_path: Path,
                              fake_llm: FakeLLM) -> None:
    queue = f"logs-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "worker.log"
    fake_llm.script(tool_reply(("c1", "add", {"a": 1, "b": 2})),
                    text_reply("3, as zq7log@example.com asked"))
    worker = WorkerProcess(log, {"TEMPORAL_ADDRESS": temporal_server.address,
                                 "TURNSTILE_TASK_QUEUE": queue, "LLM_BASE_URL": fake_llm.url,
                                 "DATABASE_URL": f"sqlite:///{tmp_path}/t.db",
                                 "TURNSTILE_LOG_FORMAT": "json"}).start()
    try:
        result = await client.execute_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id="c-logs", user_id="alice",
                                     message="1+2? tell zq7log@example.com",
                                     service="test", variables={"team": "qa"}),
            id=f"logs-{uuid.uuid4().hex[:6]}", task_queue=queue, result_type=TurnResult)
    finally:
        worker.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    lines = log.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert any(r["message"].startswith("worker serving task queue") for r in records)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    turn = [r for r in records if r.get("workflow_id") == result.workflow_id]
    assert turn, "no line carries the turn's workflow id"
    # Python's own lines are all JSON (the SDK's Rust core writes its own, unformatted).
    assert not [line for line in lines if " INFO " in line and not line.startswith("{")]
    assert "zq7log" not in log.read_text()
