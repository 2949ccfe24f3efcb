"""Masking as a property of a real turn, on every sink, on SQLite and
PostgreSQL (a real dev server, an in-process worker, the fake model server).

Each example is one turn carrying many generated values (tests/support/
masking_strategies.py): addresses in every form docs/masking.md names and
phone numbers written as text or given as integers. The model asks a tool
that needs approval to keep a record holding them as object keys, values,
integers in named and neutral fields, list items and JSON inside a string;
the reviewer's note and the model's answer hold them too (the answer itself
is the conversation: what the user is told; its status event is searched).
Then:

1. No address seed and no phone number's digits are found in any sink: the
   TurnResult, `tool_execution_log.input_params`, `approval_decision.note`,
   the Temporal history and the worker's JSON log lines (the product's
   formatter and filter). The history keeps what was sent to Temporal as sent
   — the turn's input, the reviewer's signal — and the conversation on its
   way to and from the model (the call as the model wrote it, for the tool
   and its reviewer): those events are not searched (test_masking_sinks.py).
2. Ids, timestamps, counts, UUIDs and amounts in the same record come out of
   the TurnResult and the audit log exactly as they went in.

Few turns in CI (a real turn per example); bench/masking_properties.py runs
more (MASKING_TURN_EXAMPLES).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from hypothesis import HealthCheck, given, settings, strategies as st
from temporalio.api.enums.v1 import EventType

from tests.support.loop_thread import LoopThread, hosted_worker
from tests.support.masking_strategies import (
    Form,
    addresses,
    integer_phones,
    joined,
    kept_values,
    leaks,
    phones,
)
from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import Turns, wait_pending
from turnstile.engine.activity_io import (
    CALL_MODEL,
    CLAIM_GRANT,
    EXECUTE_TOOL,
    ISSUE_GRANT,
    REVIEW_CALL,
)
from turnstile.engine.contract import ApproveSignal, TurnStatus
from turnstile.runtime.log_masking import JsonFormatter, MaskingFilter
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry, tool
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

EXAMPLES = int(os.environ.get("MASKING_TURN_EXAMPLES", "5"))  # per database


@tool(requires_approval=True, approval_timeout_seconds=600)
def keepRecord(record: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
    """Keep a contact record (needs a reviewer's approval)."""
    return {"kept": len(record)}


SERVICE = Service(name="masking", tools=ToolRegistry([keepRecord]))


class JsonLines(logging.Handler):
    """The root logger's records at INFO and above as the worker writes them
    with TURNSTILE_LOG_FORMAT=json: filtered by MaskingFilter, formatted by
    JsonFormatter."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter())
        self.addFilter(MaskingFilter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))




@pytest.fixture
def hosted(temporal_server: DevServer, db: Database, fake_llm: FakeOpenAIServer) -> Iterator[
        tuple[LoopThread, Turns, JsonLines]]:
    lines = JsonLines()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(lines)
    root.setLevel(logging.INFO)
    try:
        with hosted_worker(temporal_server.address, f"mask-{uuid.uuid4().hex[:8]}", db.url,
                           [SERVICE], llm_url=fake_llm.url) as (lt, turns):
            yield lt, turns, lines
    finally:
        root.removeHandler(lines)
        root.setLevel(old_level)


# Events that carry what was sent to Temporal as sent, or the call as the
# model wrote it (for the tool and its reviewer): not sinks of the masking.
AS_SENT = {EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
           EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED}


def history_text(events: list[Any]) -> str:
    scheduled: dict[int, str] = {}
    out: list[str] = []
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = name
            if name in (EXECUTE_TOOL, REVIEW_CALL, CLAIM_GRANT, ISSUE_GRANT, CALL_MODEL):
                continue
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED and scheduled.get(
                event.activity_task_completed_event_attributes.scheduled_event_id) == CALL_MODEL:
            continue
        if event.event_type in AS_SENT:
            continue
        out += _strings(MessageToDict(event))
    return "\n".join(out)


def _strings(value: Any) -> list[str]:
    """Every string in a decoded history event, payload data decoded too."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (
            [_without_answer(base64.b64decode(v).decode("utf-8", "replace"))]
            if k == "data" and isinstance(v, str) else _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _without_answer(payload: str) -> str:
    """A payload without the turn's answer: what the user is told is the
    conversation (unmasked by design, docs/masking.md); the rest of the
    TurnResult is searched."""
    try:
        value = json.loads(payload)
    except ValueError:
        return payload
    if isinstance(value, dict) and "answer" in value and "tool_calls" in value:
        value.pop("answer")
        return json.dumps(value, ensure_ascii=False)
    return payload


def record_of(forms: list[Form], numbers: list[tuple[str | None, int, Form]],
              kept: dict[str, Any]) -> dict[str, Any]:
    """The tool's record: the forms as keys, values, text and JSON in a
    string; the integers in their fields or a list; the values to keep."""
    record: dict[str, Any] = {f.text: i for i, f in enumerate(forms)}
    record["values"] = [f.text for f in forms]
    record["notes"] = "reach them at " + joined(forms)
    record["raw"] = json.dumps({"cc": [f.text for f in forms]})
    record["list"] = []
    for name, value, _ in numbers:
        if name is None:
            record["list"].append(value)
        else:
            record[name] = value
    record["keep"] = kept
    return record


async def one_turn(turns: Turns, db: Database, fake_llm: FakeOpenAIServer, lines: JsonLines,
                   record: dict[str, Any], note: str, answer: str) -> tuple[
        dict[str, str], dict[str, Any], dict[str, Any]]:
    """Run a turn keeping `record`: (each sink's text, the record as the
    TurnResult holds it, as the audit log holds it)."""
    key = uuid.uuid4().hex[:10]
    fake_llm.script(tool_reply(("k1", "keepRecord", {"record": record})), text_reply(answer))
    first_line = len(lines.lines)
    handle = await turns.start("keep their record", service="masking",
                               conversation=f"mask-{key}", workflow_id=f"mask-{key}")
    await wait_pending(handle)
    await handle.signal("approve", ApproveSignal(tool_call_id="k1", reviewer="bob",
                                                 comment=note))
    result = await handle.result()
    history = await handle.fetch_history()
    assert result.status == TurnStatus.COMPLETED, result.error
    with db.connect() as conn:
        audit = fetchall(conn, "SELECT input_params, error_message FROM tool_execution_log "
                               "WHERE workflow_id = :w", {"w": handle.id})
        decisions = fetchall(conn, "SELECT note FROM approval_decision WHERE workflow_id = :w",
                             {"w": handle.id})
    assert len(audit) == 1 and len(decisions) == 1
    sinks = {"result": result.model_dump_json(exclude={"answer"}),  # the answer: the conversation
             "audit": json.dumps(audit, ensure_ascii=False),
             "decisions": json.dumps(decisions, ensure_ascii=False),
             "history": history_text(list(history.events)),
             "logs": "\n".join(lines.lines[first_line:])}
    [call] = result.tool_calls
    assert isinstance(call.arguments, dict)
    return sinks, call.arguments["record"], json.loads(audit[0]["input_params"])["record"]


def test_no_generated_address_or_number_reaches_a_sink_of_a_real_turn(
        hosted: tuple[LoopThread, Turns,
                      JsonLines], db: Database, fake_llm: FakeOpenAIServer) -> None:
    lt, turns, lines = hosted
    searched: list[int] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(forms=st.lists(addresses() | phones(), min_size=6, max_size=12),
           numbers=st.lists(integer_phones(), min_size=2, max_size=5),
           kept=kept_values())
    def one(forms: list[Form], numbers: list[tuple[str | None, int, Form]],
            kept: dict[str, Any]) -> None:
        record = record_of(forms, numbers, kept)
        half = len(forms) // 2
        sinks, in_result, in_audit = lt.run(one_turn(
            turns, db, fake_llm, lines, record, note="ok, cc " + joined(forms[:half]),
            answer="kept; " + joined(forms[half:])), timeout=120)
        # 1. nothing personal in any sink (the search finds what the world holds:
        # the seeds are in the conversation, where they belong)
        found = leaks(sinks, forms + [f for _, _, f in numbers])
        assert found == [], found[:10]
        assert sinks["logs"] and "***" in sinks["audit"] and "***" in sinks["result"]
        # 2. what must stay as written, exactly
        assert in_result["keep"] == kept
        assert in_audit["keep"] == kept
        searched.append(len(forms) + len(numbers))

    one()
    assert len(searched) == EXAMPLES  # every example ran a turn and searched its sinks
    with db.connect() as conn:
        stored = json.dumps(fetchall(conn, "SELECT content FROM chat_message"))
    assert "zq" in stored  # the conversation holds the seeds: the search could find them
