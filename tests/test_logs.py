"""Log lines from a real worker process: TURNSTILE_LOG_FORMAT=json gives one
JSON object per line (with the turn's workflow id where the SDK adds it),
and addresses are masked in them whoever logs."""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path

from temporalio.client import Client

from tests.support.temporal_server import DevServer
from tests.support.worker_process import WorkerProcess
from turnstile.engine.contract import WORKFLOW_TYPE, TurnInput, TurnResult, TurnStatus
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


async def test_json_log_lines(client: Client, temporal_server: DevServer, tmp_path: Path,
                              fake_llm: FakeOpenAIServer) -> None:
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
    serving = [r["message"] for r in records
               if r["message"].startswith("worker serving task queue")]
    assert serving, "no ready line"
    # The worker runs on uvloop where it is installed (TURNSTILE_EVENT_LOOP=auto).
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    assert serving[0].endswith(f"event loop {loop})"), serving[0]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    turn = [r for r in records if r.get("workflow_id") == result.workflow_id]
    assert turn, "no line carries the turn's workflow id"
    # Activities' lines name the conversation (e.g. the turn events delivered
    # by the release); none names another.
    named = {r["conversation_id"] for r in records if "conversation_id" in r}
    assert named == {"c-logs"}, named
    # Python's own lines are all JSON (the SDK's Rust core writes its own, unformatted).
    assert not [line for line in lines if " INFO " in line and not line.startswith("{")]
    assert "zq7log" not in log.read_text()
    # Two model requests were made; httpx's line per request is not written.
    assert len(fake_llm.requests) == 2
    assert not [r for r in records if r["logger"] == "httpx"]


async def test_the_worker_serves_prometheus_metrics(
        client: Client, temporal_server: DevServer, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    """TURNSTILE_METRICS_PORT: the SDK's metrics and Turnstile's own on one
    endpoint, counted from a real turn with a tool call and an approval."""
    import asyncio

    import httpx

    from tests.support.processes import free_port
    from tests.support.turns import wait_pending
    from turnstile.engine.contract import ApproveSignal

    port = free_port()
    queue = f"metrics-{uuid.uuid4().hex[:6]}"
    fake_llm.script(tool_reply(("c1", "add", {"a": 1, "b": 2}),
                               ("p1", "sendMoneySlowly", {"to": "bob@example.com", "amount": 1})),
                    text_reply("done"))
    worker = WorkerProcess(tmp_path / "worker.log", {
        "TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": queue,
        "LLM_BASE_URL": fake_llm.url, "DATABASE_URL": f"sqlite:///{tmp_path}/t.db",
        "TURNSTILE_METRICS_PORT": str(port)}).start()
    try:
        handle = await client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id="c-metrics", user_id="alice",
                                     message="add and pay", service="test",
                                     variables={"team": "qa"}),
            id=f"metrics-{uuid.uuid4().hex[:6]}", task_queue=queue, result_type=TurnResult)
        await wait_pending(handle)
        await handle.signal("approve", ApproveSignal(tool_call_id="p1", reviewer="carol"))
        result = await handle.result()
        text = ""
        for _ in range(50):  # the exporter serves what it has collected
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
            if "turnstile_turns_ended" in text and "turnstile_model_call_latency" in text:
                break
            await asyncio.sleep(0.2)
    finally:
        worker.stop()
    assert result.status == TurnStatus.COMPLETED, result.error

    def value(prefix: str) -> float:
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        assert lines, f"no series {prefix}"
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    assert value('turnstile_turns_started{') == 1
    assert value('turnstile_turns_ended{') == 1 and 'status="completed"' in text
    assert value('turnstile_tool_calls{') == 2
    assert 'tool="add"' in text and 'outcome="completed"' in text
    assert value('turnstile_approvals_requested{') == 1
    assert value('turnstile_approvals_decided{') == 1 and 'verdict="approved"' in text
    assert value('turnstile_tokens{') > 0 and 'direction="in"' in text
    assert "turnstile_turn_latency" in text and "turnstile_approval_wait" in text
    assert "temporal_workflow_completed" in text or "temporal_activity_execution_latency" in text


async def test_json_lines_name_the_activitys_conversation_and_call() -> None:
    """activities.log_context reads them from the activity's input; the
    activity's database hops (asyncio.to_thread) carry them; outside, no line
    does."""
    import asyncio
    import io as stdio
    import logging

    from turnstile.activities.log_context import fields_of
    from turnstile.engine.activity_io import ToolExecInput
    from turnstile.engine.messages import ToolCall
    from turnstile.runtime.log_masking import JsonFormatter, MaskingFilter, log_fields

    out = stdio.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(MaskingFilter())
    logger = logging.getLogger("test.log_fields")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    request = ToolExecInput(conversation_id="c-9", user_id="u", service="s",
                            call=ToolCall(id="call_7", name="add", arguments="{}"), result_seq=1)
    try:
        with log_fields(**fields_of([request])):
            logger.info("inside")
            await asyncio.to_thread(logger.info, "in a thread")
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["message"], r.get("conversation_id"), r.get("tool_call_id")) for r in lines] == [
        ("inside", "c-9", "call_7"), ("in a thread", "c-9", "call_7"), ("outside", None, None)]
