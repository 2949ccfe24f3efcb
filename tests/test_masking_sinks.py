"""A distinctive address goes through a whole turn — the model decides to
e-mail it, a reviewer approves, the sender delivers it over SMTP — and is
then searched for in every place the product writes.

Where it may be, by design: the outbox (`email_task`) and the mailbox (the
world), the conversation (`chat_message`, `chat_message_part`: what the
model said and was told, and `tool_call_ledger`: each call's result exactly
as the model is told it, kept so a retried call answers the same), and the
history events that carry the call itself
(the model's response, the call's review, grant claim and execution input). Everywhere
else — the other tables, the log records of worker, sender and SMTP server,
the exported spans, every other history event and payload — it must be
masked.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from tests.support.processes import free_port
from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker, wait_pending
from tests.support.waiting import wait_until
from turnstile.engine.activity_io import (
    CALL_MODEL,
    CLAIM_GRANT,
    EXECUTE_TOOL,
    ISSUE_GRANT,
    REVIEW_CALL,
)
from turnstile.engine.contract import ApproveSignal, TurnStatus
from turnstile.runtime.config import Settings
from turnstile.runtime.log_masking import MaskingFilter
from turnstile.runtime.tracing import interceptors
from turnstile.sales.sender import SenderConfig, deliver_due
from turnstile.sales.service import build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.stores.db import Database
from turnstile.stores.schema import ensure_schema
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

SECRET = "zq-seed-7731"
ADDRESS = f"{SECRET}@example.com"
# The conversation (what a reset run superseded of it too), the ledger, the outbox.
WHERE_IT_BELONGS = {"email_task", "chat_message", "chat_message_part", "superseded_message",
                    "tool_call_ledger"}


class Records(logging.Handler):
    """Every log record at INFO and above: what the worker writes (worker.py
    logs at INFO; at DEBUG the Temporal SDK itself logs whole payloads)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name} {record.getMessage()} {record.__dict__!r}")


@contextmanager
def logged(*, masked: bool = False) -> Iterator[Records]:
    """The root logger's records at INFO and above while the block runs
    (`masked`: through worker.py's MaskingFilter first)."""
    records = Records()
    if masked:
        records.addFilter(MaskingFilter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(records)
    root.setLevel(logging.INFO)
    try:
        yield records
    finally:
        root.removeHandler(records)
        root.setLevel(old_level)


def strings(value: Any) -> Iterator[str]:
    """Every string in a decoded history event, payload data decoded too."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "data" and isinstance(v, str):
                yield base64.b64decode(v).decode("utf-8", "replace")
            else:
                yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, str):
        yield value


async def test_the_address_is_nowhere_it_should_not_be(
        temporal_server: DevServer, client: Client, task_queue: str, tmp_path,
        fake_llm: FakeOpenAIServer, spans: InMemorySpanExporter) -> None:
    # `client` (the shared fixture) waits until the server answers; this one traces.
    client = await Client.connect(temporal_server.address, interceptors=interceptors(),
                                  data_converter=pydantic_data_converter)
    db = Database(f"sqlite:///{tmp_path}/t.db")
    ensure_schema(db)
    port = free_port()
    env = {"SMTP_PORT": str(port), "SMTP_HOST": "127.0.0.1"}
    mail = {"to": ADDRESS, "subject": "Renewal", "body": "Please renew."}
    fake_llm.script(tool_reply(("e1", "createEmailTask", mail)),
                    text_reply("The renewal e-mail is queued."))
    spans.clear()
    with logged() as records:
        with LocalSmtpServer(tmp_path / "mail", port=port):
            async with running_worker(client, task_queue, db.url, [build_sales_service()],
                                      llm_url=fake_llm.url, env=env) as turns:
                handle = await turns.start("remind the customer about the renewal",
                                           service="sales-assistant", user="alice")
                pending = await wait_pending(handle)
                assert pending[0].arguments["to"] == ADDRESS  # the reviewer sees it in full
                await handle.signal("approve", ApproveSignal(tool_call_id="e1",
                                                             reviewer="bob"))
                result = await handle.result()
                sent = deliver_due(db, Settings.from_env({"DATABASE_URL": db.url, **env}),
                                   SenderConfig())
            await wait_until(lambda: any("stored mail" in line for line in records.lines),
                             what="the SMTP server's log line")
        [delivered] = read_mailbox(tmp_path / "mail")
    assert result.status == TurnStatus.COMPLETED and sent == 1
    assert delivered["To"] == ADDRESS  # the world got the real address ...

    # ... and so did the places where it belongs (or the search proves nothing).
    with db.connect() as conn:
        tables = [r["name"] for r in fetchall(conn,
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        dumps = {t: json.dumps(fetchall(conn, f'SELECT * FROM "{t}"'), default=str)
                 for t in tables}
    assert SECRET in dumps["email_task"] and SECRET in dumps["chat_message"]
    assert "z***@example.com" in dumps["tool_execution_log"]

    leaks = [t for t, text in dumps.items() if t not in WHERE_IT_BELONGS and SECRET in text]
    assert leaks == [], f"tables holding the address: {leaks}"

    assert any("e-mail task" in line for line in records.lines)  # the sender logged
    assert [line[:300] for line in records.lines if SECRET in line] == []

    exported = spans.get_finished_spans()
    assert exported
    assert [s.name for s in exported if SECRET in json.dumps(
        {"attrs": dict(s.attributes or {}), "events": [dict(e.attributes or {})
                                                       for e in s.events]}, default=str)] == []

    history = await handle.fetch_history()
    scheduled: dict[int, str] = {}
    carrying_the_call = []
    masked_seen = False
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = name
            if name in (EXECUTE_TOOL, REVIEW_CALL, CLAIM_GRANT, ISSUE_GRANT):
                carrying_the_call.append(event.event_id)
                continue
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            if scheduled.get(attrs.scheduled_event_id) == CALL_MODEL:
                carrying_the_call.append(event.event_id)
                continue
        text = "\n".join(strings(MessageToDict(event)))
        assert SECRET not in text, f"history event {event.event_id} ({event.event_type})"
        masked_seen = masked_seen or "z***@example.com" in text
    assert len(carrying_the_call) >= 3  # the exemptions are the ones described above
    assert masked_seen  # the result's tool-call record: decoded, and masked


HOSTILE = {
    "zq7quoted": '"zq7quoted"@evil.test',
    "zq7idn": "zq7idn@ex\u0430mple.com",
    "zq7pct": "zq7pct%40example.com",
    "zq7html": "zq7html&#64;example.com",
    "zq7fw": "zq7fw\uff20example.com",
    "zq7nest": json.dumps({"cc": json.dumps({"to": "zq7nest@example.com"})}),
}


async def test_hostile_spellings_are_masked_on_failing_paths_too(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    """Refused arguments (the error quotes the address), a refused reviewer, a
    reviewer's note, and addresses spelled to slip past a pattern: none of the
    seeds reaches the audit log, the decisions, the turn's result, its status
    query or a log line — on both databases."""
    body = "copy " + ", ".join(HOSTILE[k] for k in ("zq7pct", "zq7html", "zq7fw", "zq7nest"))
    fake_llm.script(tool_reply(
        ("c1", "createEmailTask", {"to": HOSTILE["zq7quoted"], "subject": "a", "body": "b"}),
        ("c2", "createEmailTask", {"to": HOSTILE["zq7idn"], "subject": "a", "body": "b"}),
        ("c3", "createEmailTask", {"to": "ops@example.com", "subject": "hi", "body": body})),
        text_reply("done"))
    with logged() as records:
        async with running_worker(client, task_queue, db.url, [build_sales_service()],
                                  llm_url=fake_llm.url) as turns:
            handle = await turns.start("mail them", service="sales-assistant", user="alice")
            await wait_pending(handle)
            await handle.signal("approve", ApproveSignal(
                tool_call_id="c3", reviewer="alice", comment="me: zq7self@example.com"))
            await handle.signal("approve", ApproveSignal(
                tool_call_id="c3", reviewer="bob", comment="cc zq7note@example.com"))
            result = await handle.result()
            status = await handle.query("status", result_type=dict)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status.value for c in result.tool_calls] == [
        "invalid_arguments", "invalid_arguments", "completed"]
    with db.connect() as conn:
        audit = json.dumps(fetchall(conn, "SELECT * FROM tool_execution_log"), default=str)
        decisions = json.dumps(fetchall(conn, "SELECT * FROM approval_decision"), default=str)
        world = json.dumps(fetchall(conn, "SELECT * FROM email_task"), default=str)
    assert "zq7pct" in world  # the outbox keeps what it must send (the search can find)
    sinks = {"audit": audit, "decisions": decisions, "result": result.model_dump_json(),
             "status": json.dumps(status), "logs": "\n".join(records.lines)}
    seeds = [*HOSTILE, "zq7note", "zq7self"]
    leaks = {(sink, seed) for sink, text in sinks.items() for seed in seeds if seed in text}
    assert leaks == set(), sorted(leaks)
    assert "APPROVAL_REFUSED" in audit and "***@" in audit


async def test_a_database_error_quoting_an_address_reaches_no_sink(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    """A tool's database refuses a value and its error quotes it (PostgreSQL:
    `Key (v)=(...) already exists`): the log gets the driver's text, masked;
    the audit log, memory, the ledger, the result and the history get the
    error's category only — on both databases. (The log is read through the
    filter every handler of a Turnstile process gets: its driver text is
    there, the address masked.)"""
    from tests.support.services import make_service
    from turnstile.engine.contract import CallStatus

    seed = "zq7dberr@example.com"
    fake_llm.script(tool_reply(("c1", "registerTwice", {"value": seed})), text_reply("sorry"))
    # Filtered as worker.py's logging setup does on every handler.
    with logged(masked=True) as records:
        async with running_worker(client, task_queue, db.url, [make_service()],
                                  llm_url=fake_llm.url) as turns:
            handle = await turns.start("register it")
            result = await handle.result()
            history = (await handle.fetch_history()).to_json()
    [call] = result.tool_calls
    assert call.status == CallStatus.FAILED
    with db.connect() as conn:
        rows = {t: json.dumps(fetchall(conn, f"SELECT * FROM {t}"), default=str)  # noqa: S608
                for t in ("tool_execution_log", "chat_message", "tool_call_ledger")}
    # The seed is in the call's own arguments (model output: memory, ledger,
    # history); every error text about it carries the category, not the value.
    errors = [line for line in records.lines if "attempt 1 failed" in line]
    leaked = [line for line in errors if seed in line]
    assert errors and leaked == [], "\n".join(
        line[max(0, line.index(seed) - 300):line.index(seed) + 50] for line in leaked)
    audit_errors = json.loads(rows["tool_execution_log"])
    assert all(seed not in (r["error_message"] or "") for r in audit_errors)
    assert all(seed not in (r["input_params"] or "") for r in audit_errors)
    tool_results = [r for r in json.loads(rows["chat_message"]) if r["role"] == "tool"]
    assert tool_results and all(seed not in (r["content"] or "") for r in tool_results)
    assert seed not in result.model_dump_json()  # its arguments there are masked too
    failures = [e for e in json.loads(history)["events"]
                if "activityTaskFailedEventAttributes" in e]
    assert failures and all(seed not in json.dumps(e) for e in failures)
