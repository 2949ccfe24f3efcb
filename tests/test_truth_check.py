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
from turnstile.stores.audit import execution_id
from turnstile.stores.db import Connection, Database


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

    with db.connect() as conn:  # plant three lies
        conn.execute("DELETE FROM email_task WHERE idempotency_key LIKE :k",
                     {"k": handle.id + "/%"})
        conn.execute("UPDATE tool_execution_log SET status = 'INITIATED', end_time = NULL "
                     "WHERE workflow_id = :wf AND tool_name = 'querySalesData'",
                     {"wf": handle.id})
        # Issue 12's crash: the effect committed, the ledger still says STARTED.
        key = plant_unrecorded_follow_up(conn, handle.id, conv)
    assert await starter.main(["check", "--conversation", conv]) == 1
    printed = capsys.readouterr().out
    assert "(createEmailTask)" in printed and "memory says queued; no email_task row" in printed
    assert "(querySalesData) was left open (INITIATED)" in printed
    assert f"follow_up_task rows of call {key} exist; its ledger row says STARTED" in printed
    assert printed.strip().endswith("3 disagreement(s)")


def plant_unrecorded_follow_up(conn: Connection, wf_id: str, conv: str) -> str:
    """A follow-up task of a call whose ledger row never completed."""
    key = execution_id(wf_id, "call-lost", "chain-x")
    conn.execute("INSERT INTO tool_call_ledger (workflow_id, execution_chain, tool_call_id, "
                 "tool_name, status, started_at) VALUES (:wf, 'chain-x', 'call-lost', "
                 "'createFollowUpTask', 'STARTED', 't')", {"wf": wf_id})
    conn.execute("INSERT INTO tool_execution_log (execution_id, workflow_id, conversation_id, "
                 "user_id, tool_name, start_time, status) VALUES (:k, :wf, :c, 'alice', "
                 "'createFollowUpTask', 't', 'FAILED')", {"k": key, "wf": wf_id, "c": conv})
    conn.execute("INSERT INTO follow_up_task (customer_id, assignee, note, created_by_call, "
                 "created_at) VALUES ('C0001', 'a', 'n', :k, 't')", {"k": key})
    return key
