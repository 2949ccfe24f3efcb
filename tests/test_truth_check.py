"""`python starter.py check`: memory, journal, audit, approvals and the world
tables agree after real turns (exit 0), and every planted disagreement is
printed (exit 1). On SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import Client

import starter
from tests.support.turns import running_worker
from tests.test_sales_turns import DEMO, TODAY, approve_when_asked
from turnstile.engine.contract import TurnStatus
from turnstile.providers import DemoPlanner
from turnstile.sales.seed import seed
from turnstile.sales.service import build_sales_service
from turnstile.stores.db import Database


async def test_check_agrees_after_turns_and_finds_planted_lies(
        client: Client, task_queue: str, db: Database, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    seed(db, rows=2000, today=TODAY)
    conv = f"c-check-{uuid.uuid4().hex[:6]}"
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              provider=DemoPlanner(today=lambda: TODAY)) as turns:
        handle = await turns.start(DEMO, service="sales-assistant", conversation=conv)
        await approve_when_asked(handle, "ops-lead")
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    monkeypatch.setenv("DATABASE_URL", db.url)
    capsys.readouterr()
    assert await starter.main(["check", "--conversation", conv]) == 0
    assert capsys.readouterr().out.strip().endswith("0 disagreement(s)")

    with db.connect() as conn:  # plant two lies
        conn.execute("DELETE FROM email_task WHERE idempotency_key LIKE :k",
                     {"k": handle.id + "/%"})
        conn.execute("UPDATE tool_execution_log SET status = 'INITIATED', end_time = NULL "
                     "WHERE workflow_id = :wf AND tool_name = 'querySalesData'",
                     {"wf": handle.id})
    assert await starter.main(["check", "--conversation", conv]) == 1
    printed = capsys.readouterr().out
    assert "(createEmailTask)" in printed and "memory says queued; no email_task row" in printed
    assert "(querySalesData) was left open (INITIATED)" in printed
    assert printed.strip().endswith("2 disagreement(s)")
