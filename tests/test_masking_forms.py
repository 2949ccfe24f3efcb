"""Every spelling of an address and a phone number through a whole turn of a
real worker process (JSON logs, its own span file), on SQLite and
PostgreSQL — and what must stay readable stays readable (docs/masking.md).

1. None of the forms — escape layers (`\\u0040`, `&#64` without `;`,
   `&commat;`, `%2540`), NFD, Indic local parts and domains, full-width,
   phone numbers — reaches a sink unmasked: the worker's log lines, its
   spans, the audit log, the decisions, the turn's result and status query,
   and the history events that do not carry the call itself.
Temporal keeps what was sent to it as sent (the turn's input, an update's
payload) and the conversation on its way to and from the model (the call
as the model wrote it); everything else in the history is searched.

2. An id that holds an address (the workflow id) is written one way on
   every log line and span: masked. Every other id, and every timestamp and
   duration in the worker's log lines, is intact and equal to what the
   database and Temporal hold.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import wait_pending
from tests.support.worker_process import WorkerProcess
from turnstile.engine.activity_io import (
    CALL_MODEL,
    CLAIM_GRANT,
    EXECUTE_TOOL,
    ISSUE_GRANT,
    REVIEW_CALL,
)
from turnstile.engine.contract import WORKFLOW_TYPE, ReviewInput, TurnInput, TurnResult
from turnstile.engine.masking import mask_text
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

# seed (what must disappear) -> how the model spells it in the e-mail body
FORMS = {
    "zq7uesc": "zq7uesc\\u0040example\\u002ecom",  # JSON escapes, as text
    "zq7nosemi": "zq7nosemi&#64example.com",
    "zq7commat": "zq7commat&commat;example.com",
    "zq7pct": "zq7pct%2540example.com",
    "zq7nfd": "zq7nfde\u0301@example.com",
    "zq7indic": "zq7indic\u0930\u093e\u092e@\u0909\u0926\u093e\u0939\u0930\u0923.\u092d\u093e"
                "\u0930\u0924",
    "zq7fw": "zq7fw\uff20example\uff0ecom",
    "zq7cyr": "zq7cyr@ex\u0430mple.com",
}
PHONES = {"6502530000": "+1 (650) 253-0000", "2079460958": "+44 20 7946 0958"}
SEEDS = [*FORMS, *PHONES, "253-0000", "7946 0958"]

CONVERSATION = "demo-1733337327"  # digits that are no phone number
USER = "user-4155552671"  # a valid number glued into an id: the id's part
ISO = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:[+-]\d{2}:\d{2}|Z)?")
DAMAGED = re.compile(r"\d{4}-\d{2}-\d{2}T[\d:.]*\*|\"duration_seconds\": ?\*")


def strings(value: Any) -> list[str]:
    """Every string in a decoded history event, payload data decoded too."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (
            [base64.b64decode(v).decode("utf-8", "replace")]
            if k == "data" and isinstance(v, str) else strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


async def test_no_form_reaches_a_sink_and_every_id_and_time_stays(
        client: Client, temporal_server: DevServer, db: Database, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    queue = f"forms-{uuid.uuid4().hex[:6]}"
    wf_id = f"turn-zq7wid@example.com-{uuid.uuid4().hex[:8]}"
    body = "copies: " + " ; ".join(FORMS.values()) + " call " + " or ".join(PHONES.values())
    fake_llm.script(tool_reply(("e1", "createEmailTask",
                                {"to": "ops@example.com", "subject": "Renewal", "body": body})),
                    text_reply("queued"))
    log = tmp_path / "worker.log"
    worker = WorkerProcess(log, {"TEMPORAL_ADDRESS": temporal_server.address,
                                 "TURNSTILE_TASK_QUEUE": queue, "LLM_BASE_URL": fake_llm.url,
                                 "DATABASE_URL": db.url, "TURNSTILE_LOG_FORMAT": "json",
                                 "TURNSTILE_DATA_DIR": str(tmp_path / "data")}).start()
    try:
        handle = await client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id=CONVERSATION, user_id=USER,
                                     message="mail ops, they are at " + PHONES["6502530000"],
                                     service="sales-assistant"),
            id=wf_id, task_queue=queue, result_type=TurnResult)
        await wait_pending(handle)
        await handle.execute_update("review", ReviewInput(
            tool_call_id="e1", reviewer="bob", approved=True,
            note="ok, cc " + FORMS["zq7pct"] + " " + PHONES["2079460958"]))
        result = await handle.result()
        status = await handle.query("status", result_type=dict)
        described = await handle.describe()
        history = await handle.fetch_history()
    finally:
        worker.stop()
    assert result.status.value == "completed", result.error
    lines = log.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    spans_file = tmp_path / "data" / "traces.jsonl"
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    with db.connect() as conn:
        audit = fetchall(conn, "SELECT input_params, error_message, status FROM "
                               "tool_execution_log")
        decisions = fetchall(conn, "SELECT reviewer, note FROM approval_decision")
        usage = fetchall(conn, "SELECT workflow_id, run_id, conversation_id, user_id, "
                               "recorded_at FROM model_usage")
        conversations = [r["conversation_id"] for r in fetchall(
            conn, "SELECT conversation_id FROM conversation")]
        world = json.dumps(fetchall(conn, "SELECT body FROM email_task"))
    assert "zq7nosemi" in world and "zq7pct" in world  # the world has them (the search works)

    # 1. no form on any sink
    history_text = []
    scheduled: dict[int, str] = {}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = name
            if name in (EXECUTE_TOOL, REVIEW_CALL, CLAIM_GRANT, ISSUE_GRANT, CALL_MODEL):
                continue  # the call, for the tool and its reviewer; the user's message
                # on its way to memory
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED and scheduled.get(
                event.activity_task_completed_event_attributes.scheduled_event_id) == CALL_MODEL:
            continue  # the model's response: the call as the model wrote it
        if event.event_type in (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
                                EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED):
            continue  # what was sent, as sent: the turn's input, the reviewer's update
        history_text += strings(MessageToDict(event))
    sinks = {"logs": "\n".join(lines), "spans": spans_file.read_text(),
             "audit": json.dumps(audit, ensure_ascii=False),
             "decisions": json.dumps(decisions, ensure_ascii=False),
             "result": result.model_dump_json(), "status": json.dumps(status, ensure_ascii=False),
             "history": "\n".join(history_text)}
    leaks = sorted((sink, seed) for sink, text in sinks.items() for seed in SEEDS
                   if seed in text or seed in _decoded(text))

    assert leaks == [], leaks
    assert "z***@example.com" in sinks["audit"] and "***@" in sinks["decisions"]
    # The id that holds an address: masked, one spelling, on every line and span.
    for sink in ("logs", "spans"):
        assert "zq7wid" not in sinks[sink], sink
    masked_id = mask_text(wf_id)
    assert masked_id.startswith("t***@example.com-")
    logged_ids = {r["workflow_id"] for r in records if "workflow_id" in r}
    assert logged_ids == {masked_id}, logged_ids
    span_ids = {s["attributes"].get("temporalWorkflowID") for s in spans} - {None}
    assert span_ids == {masked_id}, span_ids

    # 2. ids, timestamps and durations intact, and equal to the stores'
    run_id = described.run_id
    assert {r["run_id"] for r in records if "run_id" in r} == {run_id}
    assert {r["conversation_id"] for r in records if "conversation_id" in r} == {CONVERSATION}
    assert CONVERSATION in conversations
    assert {(u["run_id"], u["conversation_id"], u["user_id"]) for u in usage} == {
        (run_id, CONVERSATION, USER)}
    events = {r["message"].split(" ", 1)[0]: json.loads(r["message"].split(" ", 1)[1])
              for r in records if r["logger"] == "turnstile.events"}
    started, completed = events["turn_started"], events["turn_completed"]
    for event in (started, completed):
        assert (event["run_id"], event["conversation_id"], event["user_id"]) == (
            run_id, CONVERSATION, USER)
        assert event["workflow_id"] == masked_id
    start, end = (datetime.fromisoformat(e["at"]) for e in (started, completed))
    assert described.start_time is not None and described.close_time is not None
    assert described.start_time <= start <= end <= described.close_time
    # measured from step 4 (after begin_turn delivered turn_started): within the events'
    # span (to the millisecond: rounded, it may pass the span by half of one)
    assert 0 < completed["duration_seconds"] <= round((end - start).total_seconds(), 3)
    for r in records:  # every line's own time, and every time it quotes, parses
        assert datetime.fromisoformat(r["time"]).year == start.year
        for stamp in ISO.findall(r["message"]):
            datetime.fromisoformat(stamp.replace(",", "."))
    assert [line[:200] for line in lines if DAMAGED.search(line)] == []
    assert USER in sinks["logs"] and CONVERSATION in sinks["logs"]  # written, unmasked
    assert all(datetime.fromisoformat(u["recorded_at"]) for u in usage)


def _decoded(text: str) -> str:
    """`text` with JSON string escapes decoded (a sink may hold `\\u` escapes)."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return text.encode("utf-8", "replace").decode("unicode_escape", "replace") \
            if "\\u" in text else text
