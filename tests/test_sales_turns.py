"""The reference scenario through real turns: seeded database, the offline demo
planner, an approval, the outbox, a real SMTP server, the audit log."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle

from tests.support.processes import free_port
from tests.support.sql import fetchall
from tests.support.turns import running_worker
from turnstile.engine.contract import ApproveSignal, CallStatus, PendingApproval, TurnStatus
from turnstile.engine.specs import LoopPolicy
from turnstile.runtime.config import Settings
from turnstile.sales import outbox
from turnstile.sales.outbox import EmailStatus
from turnstile.sales.planner import demo_planner
from turnstile.sales.seed import seed
from turnstile.sales.sender import SenderConfig, deliver_due
from turnstile.sales.service import build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.stores.schema import ensure_schema
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

# The real date: on PostgreSQL the query role only sees the last 90 days
# (row-level security), so demo data seeded around a fixed date would fall out
# of sight as the calendar moves on.
TODAY = datetime.now(UTC).date()
LAST_MONDAY = TODAY - timedelta(days=TODAY.weekday() + 7)
DEMO = "Find customers whose sales last week exceeded 50,000 and email ops@example.com to follow up"


async def approve_when_asked(handle: WorkflowHandle, reviewer: str) -> list[PendingApproval]:
    for _ in range(300):
        pending = await handle.query("pending_approvals", result_type=list[PendingApproval])
        if pending:
            for p in pending:
                await handle.signal("approve", ApproveSignal(tool_call_id=p.tool_call_id,
                                                             reviewer=reviewer))
            return pending
        await asyncio.sleep(0.05)
    raise TimeoutError("the turn never asked for approval")


def email_tasks(db: Database, wf_id: str) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, "SELECT * FROM email_task WHERE idempotency_key LIKE :key",
                              {"key": wf_id + "/%"})


async def test_demo_turn_end_to_end(client: Client, task_queue: str, tmp_path,
                                    db: Database) -> None:
    """On SQLite and on PostgreSQL (memory, audit, locks, outbox, read-only role)."""
    url = db.url
    seed(db, rows=3000, today=TODAY)
    port = free_port()
    env = {"SMTP_PORT": str(port), "SMTP_HOST": "127.0.0.1"}
    with LocalSmtpServer(tmp_path / "mail", port=port):
        async with running_worker(client, task_queue, url, [build_sales_service()],
                                  provider=demo_planner(today=lambda: TODAY), env=env) as turns:
            handle = await turns.start(DEMO, service="sales-assistant", conversation="c-demo")
            [pending] = await approve_when_asked(handle, "ops-lead")
            result = await handle.result()
            assert pending.tool_name == "createEmailTask"
            assert pending.arguments["to"] == "ops@example.com"
            # Queued by the turn, delivered by the sender over SMTP.
            [task] = email_tasks(db, handle.id)
            assert task["status"] == EmailStatus.QUEUED
            sent = deliver_due(db, Settings.from_env({"DATABASE_URL": url, **env}),
                               SenderConfig())
            audit = AuditLog(db).rows(handle.id)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.provider == "offline-demo-planner"
    assert result.answer.startswith("[offline demo planner]")
    assert [(c.name, c.status) for c in result.tool_calls] == [
        ("querySalesData", CallStatus.COMPLETED), ("createFollowUpTask", CallStatus.COMPLETED),
        ("createEmailTask", CallStatus.COMPLETED)]
    query = result.tool_calls[0].arguments
    assert query == {"startDate": LAST_MONDAY.isoformat(),
                     "endDate": (LAST_MONDAY + timedelta(days=6)).isoformat(),
                     "minAmount": 50000.0}
    customers = result.tool_calls[1].arguments["customerIds"]
    assert customers and all(c in result.answer for c in customers)
    assert sent == 1 and outbox.get(db, task["task_id"]).status == EmailStatus.SENT
    [mail] = read_mailbox(tmp_path / "mail")
    assert mail["To"] == "ops@example.com" and customers[0] in mail.get_content()
    assert [(r.tool_name, r.status) for r in audit] == [
        ("querySalesData", "COMPLETED"), ("createFollowUpTask", "COMPLETED"),
        ("createEmailTask", "COMPLETED")]
    assert "o***@example.com" in audit[2].input_params  # masked in the audit log


async def test_compensating_an_email_already_sent_is_honest(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    url = f"sqlite:///{tmp_path}/sales.db"
    db = Database(url)
    ensure_schema(db)
    port = free_port()
    env = {"SMTP_PORT": str(port), "SMTP_HOST": "127.0.0.1"}
    settings = Settings.from_env({"DATABASE_URL": url, **env})

    def deliver_then_call_again(request: dict[str, Any]) -> dict[str, Any]:
        deliver_due(db, settings, SenderConfig())  # the sender got there first
        return tool_reply(("s2", "getEmailTaskStatus", {"taskId": "whatever"}))

    fake_llm.script(
        tool_reply(("e1", "createEmailTask", {"to": "ops@example.com", "subject": "s",
                                              "body": "b"})),
        deliver_then_call_again, text_reply("unused"))
    service = build_sales_service()
    service.loop = LoopPolicy(max_round_trips=1)  # the second tool round fails the turn
    with LocalSmtpServer(tmp_path / "mail", port=port):
        async with running_worker(client, task_queue, url, [service], llm_url=fake_llm.url,
                                  env=env) as turns:
            handle = await turns.start("mail ops", service="sales-assistant",
                                       conversation="c-sent")
            await approve_when_asked(handle, "ops-lead")
            result = await handle.result()
            memory = MemoryStore(db).messages("c-sent")
            audit = AuditLog(db).rows(handle.id)
        mails = read_mailbox(tmp_path / "mail")
    assert result.status == TurnStatus.COMPENSATION_FAILED
    assert result.error is not None and result.error.type == "RoundTripCapExceeded"
    assert "createEmailTask (e1)" in result.error.message
    assert result.tool_calls[0].rolled_back is False
    assert len(mails) == 1  # delivered once; the undo did not pretend otherwise
    told = next(m for m in memory if m.tool_call_id == "e1")
    assert told.is_error and "NOT UNDONE" in (told.content or "")
    assert "cannot be recalled: the effect remains" in (told.content or "")
    assert [(r.tool_name, r.status) for r in audit] == [
        ("createEmailTask", "COMPENSATION_FAILED"), ("getEmailTaskStatus", "FAILED")]
    assert audit[0].error_message.startswith("effect remains")
    assert "round-trip cap" in audit[1].error_message  # the capped call: not run
