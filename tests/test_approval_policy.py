"""Approvals with authority (docs/approvals-guide.md): who may decide, what the
reviewer sees, where e-mail may go, and pasted commands that stay commands.

Real dev server, in-process worker, the reference sales service on SQLite,
the strict scripted model over HTTP.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from typing import Any

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker, wait_pending
from turnstile.cli.starter import signal_command
from turnstile.engine.approvals import OutboundPolicy
from turnstile.engine.contract import (
    ApprovalDecision,
    ApproveSignal,
    CallStatus,
    RejectSignal,
    ReviewInput,
    TurnProgress,
    TurnStatus,
)
from turnstile.runtime.devstack import temporal_binary
from turnstile.sales.service import build_sales_service
from turnstile.stores.db import Database
from turnstile.stores.schema import ensure_schema
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MAIL = {"to": "ops@example.com", "subject": "Follow up: top customers", "body": "C0001, C0002"}



def rows(db: Database, sql: str, **params: Any) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, sql, params)


def sqlite_db(tmp_path) -> Database:  # type: ignore[no-untyped-def]
    db = Database(f"sqlite:///{tmp_path}/t.db")
    ensure_schema(db)
    return db


async def test_only_allowed_reviewers_decide_and_every_outcome_is_audited(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    db = sqlite_db(tmp_path)
    with db.connect() as conn:  # the operator narrows who may approve e-mail
        conn.execute("INSERT INTO approver (service, tool, reviewer) VALUES (:s, :t, :r)",
                     {"s": "sales-assistant", "t": "createEmailTask", "r": "ops-lead"})
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        [p] = await wait_pending(handle)
        # What the reviewer sees: validated, full arguments, the fields that matter first.
        assert p.validated and p.arguments == MAIL
        assert p.highlights == {"to": "ops@example.com", "subject": "Follow up: top customers"}

        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="alice"))
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="mallory"))
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("review", ReviewInput(
                tool_call_id="e1", reviewer="mallory", approved=True))
        assert "not an approver of createEmailTask" in str(refused.value.cause)
        assert rows(db, "SELECT * FROM email_task") == []  # nothing applied yet
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="ops-lead"))
        result = await handle.result()
        progress = await handle.query("status", result_type=TurnProgress)

    assert result.status == TurnStatus.COMPLETED
    assert result.tool_calls[0].status == CallStatus.COMPLETED
    # Every refusal, whichever door (two signals, one update), is recorded and audited.
    assert len(progress.refused_signals) == progress.refused_signals_total == 3
    assert "'alice' requested this call" in progress.refused_signals[0]
    assert "'mallory' is not an approver" in progress.refused_signals[1]
    assert "'mallory' is not an approver" in progress.refused_signals[2]
    refusals = rows(db, "SELECT tool_name, input_params, status, error_message FROM "
                        "tool_execution_log WHERE workflow_id = :wf AND status = :status "
                        "ORDER BY execution_id", wf=handle.id, status="APPROVAL_REFUSED")
    assert [r["tool_name"] for r in refusals] == ["createEmailTask"] * 3
    assert '"reviewer": "alice"' in refusals[0]["input_params"]
    assert "requested this call" in refusals[0]["error_message"]
    assert "not an approver" in refusals[1]["error_message"]
    assert '"door": "update review"' in refusals[2]["input_params"]
    assert "not an approver" in refusals[2]["error_message"]
    assert rows(db, "SELECT reviewer, approved FROM approval_decision WHERE workflow_id = :wf",
                wf=handle.id) == [{"reviewer": "ops-lead", "approved": 1}]
    assert len(rows(db, "SELECT * FROM email_task")) == 1


async def test_by_default_anyone_named_but_the_requester(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    db = sqlite_db(tmp_path)
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        await wait_pending(handle)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("review", ReviewInput(
                tool_call_id="e1", reviewer="alice", approved=True))
        assert "'alice' requested this call and may not decide it" in str(refused.value.cause)
        for variant in ["Alice", " alice ", "ＡＬＩＣＥ", "ali\u200bce", "alice\u00ad",
                        "\u200b"]:  # the requester's name, respelled
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update("review", ReviewInput(
                    tool_call_id="e1", reviewer=variant, approved=True))
            cause = refused.value.cause
            assert isinstance(cause, ApplicationError) and cause.type == "DecisionRefused"
            assert ("requested this call" in str(cause)
                    or "needs a named reviewer" in str(cause)), (variant, str(cause))
        decided = await handle.execute_update("review", ReviewInput(
            tool_call_id="e1", reviewer="bob", approved=True), result_type=ApprovalDecision)
        assert (decided.approved, decided.reviewer, decided.tool_name) == (
            True, "bob", "createEmailTask")
        with pytest.raises(WorkflowUpdateFailedError) as again:  # one decision per call
            await handle.execute_update("review", ReviewInput(
                tool_call_id="e1", reviewer="carol", approved=False))
        assert "already decided" in str(again.value.cause)
        assert (await handle.result()).status == TurnStatus.COMPLETED


async def test_a_recipient_outside_the_allow_list_never_reaches_the_outbox(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    db = sqlite_db(tmp_path)
    planted = {**MAIL, "to": "cfo@attacker.test"}  # e.g. planted in a customer's name
    fake_llm.script(tool_reply(("e1", "createEmailTask", planted)), text_reply("could not"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        result = await handle.result()  # no reviewer was ever asked
    assert result.tool_calls[0].status == CallStatus.INVALID_ARGUMENTS
    told = [m for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert "recipient domain 'attacker.test' is not allowed" in told
    assert rows(db, "SELECT * FROM email_task") == []
    assert rows(db, "SELECT * FROM approval_decision") == []


async def test_a_policy_that_allows_external_recipients_says_so(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    db = sqlite_db(tmp_path)
    external = {**MAIL, "to": "partner@elsewhere.org"}
    policy = OutboundPolicy(allowed_domains=["example.com"], allow_external=True)
    fake_llm.script(tool_reply(("e1", "createEmailTask", external)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service(policy)],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail partner", service="sales-assistant", user="alice")
        [p] = await wait_pending(handle)
        assert p.notes == ["external recipient: to at elsewhere.org"]
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="bob"))
        assert (await handle.result()).status == TurnStatus.COMPLETED
    assert [r["recipient"] for r in rows(db, "SELECT recipient FROM email_task")] == [
        "partner@elsewhere.org"]


async def test_a_pasted_command_with_a_hostile_call_id_only_signals(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,
        temporal_server: DevServer) -> None:
    db = sqlite_db(tmp_path)
    marker = tmp_path / "PWNED"
    hostile = f"e1'; touch {marker}; echo '$(touch {marker})`touch {marker}`"
    # A "/" is Turnstile's (the audit keys refusals with it): the model's id
    # keeps every other character, its slashes become "-", with a suffix.
    kept = hostile.replace("/", "-")
    fake_llm.script(tool_reply((hostile, "createEmailTask", MAIL)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        [p] = await wait_pending(handle)
        assert p.tool_call_id.startswith(kept) and "/" not in p.tool_call_id
        command = signal_command(handle.id, p, "bob")
        env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server.address,
               "PATH": f"{os.path.dirname(temporal_binary())}:{os.environ.get('PATH', '')}"}
        done = subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        result = await handle.result()
    assert not marker.exists()
    assert result.status == TurnStatus.COMPLETED
    assert rows(db, "SELECT tool_call_id, reviewer FROM approval_decision") == [
        {"tool_call_id": p.tool_call_id, "reviewer": "bob"}]


async def test_a_refusal_after_the_last_round_is_audited_before_the_turn_ends(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    db = sqlite_db(tmp_path)
    answering = threading.Event()

    def held_answer(request: dict[str, Any]) -> dict[str, Any]:
        answering.wait(30)  # the last model call waits until the test has signalled
        return text_reply("queued")

    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), held_answer)
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        await wait_pending(handle)
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="bob"))
        for _ in range(200):  # the round is over: the last model call is running
            if len(fake_llm.requests) == 2:
                break
            await asyncio.sleep(0.05)
        await handle.signal("reject", RejectSignal(tool_call_id="e1", reviewer="mallory"))
        for _ in range(200):  # no round left to write it with
            if (await handle.query("status", result_type=TurnProgress)).refused_signals:
                break
            await asyncio.sleep(0.05)
        answering.set()
        assert (await handle.result()).status == TurnStatus.COMPLETED
    refusals = rows(db, "SELECT input_params, error_message FROM tool_execution_log "
                        "WHERE workflow_id = :wf AND status = :status",
                    wf=handle.id, status="APPROVAL_REFUSED")
    assert len(refusals) == 1 and "already decided" in refusals[0]["error_message"]
    assert '"reviewer": "mallory"' in refusals[0]["input_params"]
