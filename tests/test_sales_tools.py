"""Follow-up and e-mail tools: validation, idempotency per call, compensation."""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.sql import fetchall, fetchone
from tests.test_sales_query import INJECTIONS
from turnstile.engine.date_ranges import date_variables
from turnstile.engine.errors import ToolArgumentError
from turnstile.runtime.config import Settings
from turnstile.runtime.tools import Tool, ToolContext, ToolExecutionError, Undo
from turnstile.sales import outbox
from turnstile.sales.outbox import EmailStatus
from turnstile.sales.sales_tools import (
    checkEmailConfig,
    createEmailTask,
    createFollowUpTask,
    getEmailTaskStatus,
    retryEmailTask,
)
from turnstile.sales.schema import utc_text
from turnstile.sales.service import build_compact_sales_service, build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer
from turnstile.stores.db import Database

pytest_plugins = ["tests.support.databases"]

CUSTOMERS = ["C0001", "C0002", "C0003"]


def ctx_for(db: Database, call_id: str = "call-1", settings: Settings | None = None
            ) -> ToolContext:
    return ToolContext(db=db, workflow_id="wf-test", conversation_id="c", user_id="u",
                       tool_call_id=call_id, settings=settings)


async def run(tool: Tool, ctx: ToolContext, **arguments: Any) -> Any:
    return await tool.invoke(ctx, tool.parse_arguments(json.dumps(arguments)))


def count(db: Database, sql: str, params: dict[str, Any] | None = None) -> int:
    with db.connect() as conn:
        row = fetchone(conn, f"SELECT COUNT(*) AS n FROM {sql}", params)
    return int(row["n"]) if row else 0


@pytest.fixture
def sales_db(db: Database) -> Database:
    # Yesterday: inside the 90 days the tools' reader may see on PostgreSQL.
    when = utc_text(datetime.now(UTC) - timedelta(days=1))
    with db.connect() as conn:
        conn.executemany(
            "INSERT INTO sales_record VALUES (:id, :c, :name, :email, 100, :when)",
            [{"id": i, "c": c, "name": f"Name {c}", "email": f"{c.lower()}@example.com",
              "when": when} for i, c in enumerate(CUSTOMERS)],
        )
    return db


def test_service_has_the_six_contract_tools() -> None:
    service = build_sales_service()
    assert service.name == "sales-assistant"
    assert service.tools.names() == ["querySalesData", "createFollowUpTask", "checkEmailConfig",
                                     "createEmailTask", "getEmailTaskStatus", "retryEmailTask"]
    spec = {t.name: t for t in service.spec().tools}
    assert spec["createEmailTask"].requires_approval and spec["createEmailTask"].fatal_on_failure
    assert spec["createEmailTask"].compensation and spec["createFollowUpTask"].compensation
    assert all(spec[n].idempotent for n in ("querySalesData", "checkEmailConfig",
                                            "getEmailTaskStatus"))
    assert set(spec["createFollowUpTask"].parameters["properties"]) == {
        "customerIds", "assignee", "note"}
    # Only built-in variables: a turn never has to supply any.
    builtins = {"today", "weekday", *date_variables(date(2026, 12, 6))}
    for prompt in (service.system_prompt, build_compact_sales_service().system_prompt):
        named = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", prompt))
        assert "date_ranges" in named and named <= builtins


# --- createFollowUpTask ------------------------------------------------------------

async def test_follow_up_is_idempotent_per_call_and_compensates(sales_db: Database) -> None:
    ctx = ctx_for(sales_db, "call-a")
    args = {"customerIds": CUSTOMERS + ["C0001"], "assignee": "ops@example.com", "note": "call"}
    first = await run(createFollowUpTask, ctx, **args)
    again = await run(createFollowUpTask, ctx, **args)  # activity retry: same call id
    assert first == again and first.createdCount == 3
    assert count(sales_db, "follow_up_task") == 3
    other = await run(createFollowUpTask, ctx_for(sales_db, "call-b"), **args)
    assert count(sales_db, "follow_up_task") == 6 and other.createdByCall == "wf-test/call-b"

    undo = createFollowUpTask.compensate
    assert undo is not None
    text = undo(ctx, args, first.model_dump_json())  # result as stored text
    assert "cancelled 3 follow-up task(s)" in text
    assert count(sales_db, "follow_up_task WHERE status = 'CANCELLED'") == 3
    assert count(sales_db, "follow_up_task WHERE created_by_call = :key AND status = 'OPEN'",
                 {"key": "wf-test/call-b"}) == 3
    assert "cancelled 0" in undo(ctx, args, None)  # again, without a result: by call key
    assert count(sales_db, "follow_up_task WHERE status = 'CANCELLED'") == 3


async def test_follow_up_rejects_unknown_and_malformed_customers(sales_db: Database) -> None:
    with pytest.raises(ToolArgumentError, match="unknown customerIds: C9999; use the customerId"):
        await run(createFollowUpTask, ctx_for(sales_db), customerIds=["C0001", "C9999"],
                  assignee="a", note="n")
    with pytest.raises(ToolArgumentError, match="customerIds.0: Value error, 'C 1' is not a cus"):
        createFollowUpTask.parse_arguments('{"customerIds": ["C 1"], "assignee": "a", "note": "n"}')
    with pytest.raises(ToolArgumentError, match="customerIds: List should have at least 1 item"):
        createFollowUpTask.parse_arguments('{"customerIds": [], "assignee": "a", "note": "n"}')
    assert count(sales_db, "follow_up_task") == 0


async def test_follow_up_injection_strings_are_data_or_rejected(sales_db: Database) -> None:
    for i, payload in enumerate(INJECTIONS):
        with pytest.raises(ToolArgumentError):
            await run(createFollowUpTask, ctx_for(sales_db, f"id-{i}"),
                      customerIds=[payload], assignee="a", note="n")
    stored = 0
    for i, payload in enumerate(INJECTIONS):
        ctx = ctx_for(sales_db, f"text-{i}")
        try:
            await run(createFollowUpTask, ctx, customerIds=["C0002"], assignee=payload or "x",
                      note=payload or "x")
        except ToolArgumentError:
            continue  # e.g. a line break in the assignee
        stored += 1
        with sales_db.connect() as conn:
            rows = fetchall(conn, "SELECT assignee, note FROM follow_up_task"
                                  " WHERE created_by_call = :key", {"key": ctx.idempotency_key})
        assert rows == [{"assignee": payload or "x", "note": payload or "x"}]
    assert count(sales_db, "follow_up_task") == stored >= 50
    assert count(sales_db, "sales_record") == 3


# --- createEmailTask ---------------------------------------------------------------

async def test_email_task_is_queued_once_per_call(db: Database) -> None:
    ctx = ctx_for(db, "mail-call")
    first = await run(createEmailTask, ctx, to="ops@example.com", subject="Hi", body="Body")
    assert first.status == EmailStatus.QUEUED and "nothing has been sent" in first.note
    again = await run(createEmailTask, ctx, to="ops@example.com", subject="Hi", body="Body")
    assert again.taskId == first.taskId and "already queued" in again.note
    assert count(db, "email_task") == 1
    status = await run(getEmailTaskStatus, ctx, taskId=first.taskId)
    assert (status.status, status.attempts, status.sentAt) == (EmailStatus.QUEUED, 0, None)
    assert status.messageId == f"<{first.taskId}@turnstile.local>"


@pytest.mark.parametrize(("arguments", "fragment"), [
    ({"to": "not-an-address", "subject": "s", "body": "b"}, "to: Value error, 'not-an-address'"),
    ({"to": "a@b.com, c@d.com", "subject": "s", "body": "b"}, "one e-mail address"),
    ({"to": "a@b.com", "subject": "s\r\nBcc: x@y.com", "body": "b"}, "single line"),
    ({"to": "a@b.com", "subject": "", "body": "b"}, "subject: String should have at least 1"),
    ({"to": "a@b.com", "subject": "s"}, "body: Field required"),
])
def test_email_arguments_are_validated(arguments: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ToolArgumentError) as err:
        createEmailTask.parse_arguments(json.dumps(arguments))
    assert fragment in str(err.value)


async def test_email_injection_strings_are_data_or_rejected(db: Database) -> None:
    created = 0
    for i, payload in enumerate(INJECTIONS):
        for field in ("to", "subject", "body"):
            arguments = {"to": "ops@example.com", "subject": "s", "body": "b", field: payload}
            ctx = ctx_for(db, f"{field}-{i}")
            try:
                result = await run(createEmailTask, ctx, **arguments)
            except ToolArgumentError:
                continue
            created += 1
            task = outbox.get(db, result.taskId)
            assert task is not None
            assert (task.recipient, task.subject, task.body) == (
                arguments["to"], arguments["subject"], arguments["body"])
        for tool in (getEmailTaskStatus, retryEmailTask):
            with pytest.raises(ToolArgumentError, match="taskId"):
                tool.parse_arguments(json.dumps({"taskId": payload}))
    assert count(db, "email_task") == created >= 100


async def _task_in(db: Database, status: EmailStatus, *, possibly_sent: bool = False
                   ) -> tuple[ToolContext, Any]:
    ctx = ctx_for(db, f"call-{status}-{possibly_sent}")
    created = await run(createEmailTask, ctx, to="ops@example.com", subject="s", body="b")
    with db.connect() as conn:
        conn.execute("UPDATE email_task SET status = :status, possibly_sent = :possibly_sent,"
                     " sent_at = '2025-03-12T10:00:00.000000Z' WHERE task_id = :task_id",
                     {"status": status, "possibly_sent": possibly_sent,
                      "task_id": created.taskId})
    return ctx, created


@pytest.mark.parametrize(("status", "possibly_sent", "after", "fragment", "undone"), [
    (EmailStatus.QUEUED, False, EmailStatus.CANCELLED, "cancelled before it was sent", True),
    (EmailStatus.FAILED, False, EmailStatus.CANCELLED, "nothing was delivered", True),
    (EmailStatus.FAILED, True, EmailStatus.CANCELLED, "may already have reached", False),
    (EmailStatus.SENT, False, EmailStatus.SENT, "cannot be recalled: the effect remains", False),
    (EmailStatus.SENDING, False, EmailStatus.SENDING, "cannot be stopped", False),
    (EmailStatus.DEAD, False, EmailStatus.DEAD, "never delivered", True),
])
@pytest.mark.parametrize("recorded", [True, False])
async def test_email_compensation_is_honest(db: Database, status: EmailStatus,
                                            possibly_sent: bool, after: EmailStatus,
                                            fragment: str, undone: bool, recorded: bool) -> None:
    ctx, created = await _task_in(db, status, possibly_sent=possibly_sent)
    undo = createEmailTask.compensate
    assert undo is not None
    # Without a recorded result the task is found by the call's idempotency key.
    report = undo(ctx, {}, created.model_dump() if recorded else None)
    # An effect that remains is reported as not undone, never as rolled back.
    text = report.description if isinstance(report, Undo) else report
    assert fragment in text
    assert (report.undone if isinstance(report, Undo) else True) is undone
    task = outbox.get(db, created.taskId)
    assert task is not None and task.status == after
    undo(ctx, {}, None)  # running it again changes nothing
    assert outbox.get(db, created.taskId) == task


async def test_retry_only_failed_tasks(db: Database) -> None:
    ctx, queued = await _task_in(db, EmailStatus.QUEUED)
    with pytest.raises(ToolExecutionError, match="only FAILED tasks can be retried, and this "
                                                 "one is QUEUED") as err:
        await run(retryEmailTask, ctx, taskId=queued.taskId)
    assert err.value.retryable is False
    ctx, failed = await _task_in(db, EmailStatus.FAILED)
    again = await run(retryEmailTask, ctx, taskId=failed.taskId)
    assert again.status == EmailStatus.QUEUED
    ctx, unsure = await _task_in(db, EmailStatus.FAILED, possibly_sent=True)
    with pytest.raises(ToolExecutionError, match="may already have arrived"):
        await run(retryEmailTask, ctx, taskId=unsure.taskId)
    with pytest.raises(ToolArgumentError, match="no e-mail task mail-0"):
        await run(getEmailTaskStatus, ctx, taskId="mail-" + "0" * 32)


async def test_check_email_config_reports_reachability(db: Database, tmp_path: Path,
                                                      unused_tcp_port: int) -> None:
    port = unused_tcp_port
    settings = Settings(smtp_host="127.0.0.1", smtp_port=port)
    down = await run(checkEmailConfig, ctx_for(db, settings=settings))
    assert (down.smtpHost, down.smtpPort, down.reachable) == ("127.0.0.1", port, False)
    with LocalSmtpServer(tmp_path, port=port):
        up = await run(checkEmailConfig, ctx_for(db, settings=settings))
    assert up.reachable is True and up.detail.startswith("connected")
