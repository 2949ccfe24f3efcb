"""Every decision that enters a turn is read by the product, bounded and,
when refused, audited; an approval may carry the reviewer's edited
arguments; a decision is bound to the arguments the reviewer saw
(docs/approvals.md).

Real dev server, in-process worker, the reference sales service on SQLite
and PostgreSQL, the strict scripted model over HTTP, a real SMTP server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from tests.support.processes import free_port
from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker, wait_pending
from tests.support.worker_process import ROOT
from turnstile.cli.starter import review as cli_review
from turnstile.client import ApprovalRefused, TurnstileClient
from turnstile.engine.approvals import arguments_digest
from turnstile.engine.contract import (
    ApproveSignal,
    CallStatus,
    PendingApproval,
    ReviewInput,
    TurnProgress,
    TurnStatus,
)
from turnstile.engine.decision_payloads import DECISION_NOTE_MAX
from turnstile.runtime.config import Settings
from turnstile.runtime.devstack import temporal_binary
from turnstile.sales.sender import SenderConfig, deliver_due
from turnstile.sales.service import build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MAIL = {"to": "ops@example.com", "subject": "Renewal reminder", "body": "Please renew."}


def rows(db: Database, sql: str, **params: Any) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, sql, params)


def audit(db: Database, workflow_id: str, status: str) -> list[dict[str, Any]]:
    """The turn's audit rows of `status`; refusals in the order the turn saw them."""
    found = rows(db, "SELECT execution_id, tool_name, input_params, error_message FROM "
                     "tool_execution_log WHERE workflow_id = :wf AND status = :status",
                 wf=workflow_id, status=status)
    def seen(row: dict[str, Any]) -> int:
        before, mark, n = row["execution_id"].rpartition("/refused-")
        return int(n) if mark else 0

    return sorted(found, key=seen)


async def progress(handle: WorkflowHandle[Any, Any]) -> TurnProgress:
    return await handle.query("status", result_type=TurnProgress)


async def audited(db: Database, handle: WorkflowHandle[Any, Any],
                  n: int) -> list[dict[str, Any]]:
    """The turn's APPROVAL_REFUSED rows once there are `n` (10 s at most)."""
    for _ in range(200):
        found = audit(db, handle.id, "APPROVAL_REFUSED")
        if len(found) >= n:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {n} refusal rows: {audit(db, handle.id, 'APPROVAL_REFUSED')}")


def turns_client(client: Client, task_queue: str) -> TurnstileClient:
    return TurnstileClient(client, Settings.from_env({"TURNSTILE_TASK_QUEUE": task_queue}))


async def refused_update(handle: WorkflowHandle[Any, Any], payload: Any) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("review", payload)
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "DecisionRefused", cause
    return str(cause)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
async def test_malformed_decisions_are_refused_recorded_and_audited(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        await wait_pending(handle)
        # What the SDK used to drop with a log line: each one a refusal now.
        await handle.signal("approve", 5)
        await handle.signal("approve", {"tool_call_id": 7, "reviewer": "bob"})
        await handle.signal("approve", {"tool_call_id": "e1"})
        await handle.signal("reject", {"tool_call_id": "e1", "reviewer": ["bob"]})
        await handle.signal("approve", b"\x00\xffnot json")
        await handle.signal("approve", args=[{"tool_call_id": "e1"}, {"reviewer": "bob"}])
        await handle.signal("approve", {"tool_call_id": "e1", "reviewer": "bob",
                                        "argumnets": {"to": "x@example.com"}})
        await handle.signal("aprove", {"tool_call_id": "e1", "reviewer": "bob"})
        signals = 8
        refused = await audited(db, handle, signals)
        # The update door reads its payload the same way, and audits the refusal.
        why = await refused_update(handle, {"tool_call_id": 9, "reviewer": "bob",
                                            "approved": "yes"})
        assert "tool_call_id must be a string" in why and "approved must be true" in why
        refused = await audited(db, handle, signals + 1)
        seen = await progress(handle)
        assert seen.refused_signals_total == len(seen.refused_signals) == signals + 1
        assert [p.tool_call_id for p in seen.pending_approvals] == ["e1"]  # still waiting
        # ... and decidable.
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="bob"))
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED
    assert result.tool_calls[0].status == CallStatus.COMPLETED
    reasons = [r["error_message"] for r in refused]
    expected = ["expected a JSON object, got a number", "tool_call_id must be a string",
                "reviewer must be a string, got null", "reviewer must be a string, got a list",
                "is not JSON", "expected one payload", "unknown field(s) 'argumnets'",
                "unknown signal 'aprove'", "tool_call_id must be a string"]
    for reason, want in zip(reasons, expected, strict=True):
        assert want in reason, (want, reason)
    assert [json.loads(r["input_params"])["door"] for r in refused] == [
        "signal approve"] * 3 + ["signal reject"] + ["signal approve"] * 3 + ["signal",
                                                                       "update review"]
    assert all(r["tool_name"] in ("createEmailTask", "(none)") for r in refused)
    assert json.loads(refused[2]["input_params"])["decision"] == "approve"
    assert rows(db, "SELECT reviewer FROM approval_decision") == [{"reviewer": "bob"}]


def raw_json(text: str) -> RawValue:
    """A payload of JSON text as it is written (escapes kept, as a CLI sends)."""
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=text.encode("ascii")))


async def run(*argv: str | bytes, env: dict[str, str] | None = None) -> tuple[int, str]:
    """A command (bytes for an argument that is no UTF-8): exit code, output."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env={**os.environ, **(env or {})}, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode("utf-8", "replace")


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
async def test_a_reviewer_name_holding_a_lone_surrogate_decides_through_no_door(
        client: Client, temporal_server: DevServer, task_queue: str, db: Database,
        fake_llm: FakeOpenAIServer) -> None:
    """`b\\ud800ob` was read as `bob` and approved (the decision row said
    `b\\ufffdob`). Each door now refuses it, audited: the Temporal CLI's
    signal (its JSON escape), a raw signal and update, TurnstileClient, and
    `starter.py approve` given bytes that are no UTF-8 (argv's surrogates)."""
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        await wait_pending(handle)
        escaped = '{"tool_call_id":"e1","reviewer":"b\\ud800ob"}'
        code, said = await run(temporal_binary(), "workflow", "signal", "--workflow-id",
                               handle.id, "--name", "approve", "--input", escaped,
                               "--address", temporal_server.address)
        assert code == 0, said
        await handle.signal("reject", raw_json(escaped))
        why = await refused_update(handle, raw_json(
            '{"tool_call_id":"e1","reviewer":"b\\ud800ob","approved":true}'))
        assert "lone surrogate" in why
        tc = turns_client(client, task_queue)
        with pytest.raises(ApprovalRefused) as refused:
            await tc.review(handle.id, "e1", True, "b\ud800ob", "it's me")
        assert "'b\\ud800ob' is not a valid name (it holds U+D800, a lone surrogate" in (
            refused.value.reason)
        code, said = await run(sys.executable, "starter.py", "approve", handle.id, "e1",
                               "--reviewer", b"b\xffob", env={
                                   "TEMPORAL_ADDRESS": temporal_server.address,
                                   "TURNSTILE_TASK_QUEUE": task_queue, "DATABASE_URL": db.url})
        assert code == 1 and "approve refused for e1: " in said and "U+DCFF" in said, said
        rows_now = await audited(db, handle, 5)
        assert [p.tool_call_id for p in await wait_pending(handle)] == ["e1"]  # still waiting
        decided = await tc.review(handle.id, "e1", True, "bob", "ok")
        result = await handle.result()
    assert decided.reviewer == "bob" and result.status == TurnStatus.COMPLETED
    assert [json.loads(r["input_params"])["door"] for r in rows_now] == [
        "signal approve", "signal reject", "update review", "update review", "update review"]
    for row in rows_now:
        assert "is not a valid name (it holds U+D" in row["error_message"], row
        assert "lone surrogate" in row["error_message"]
    assert rows(db, "SELECT reviewer FROM approval_decision") == [{"reviewer": "bob"}]


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
async def test_the_requesters_three_tries_through_review_leave_three_rows(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        await wait_pending(handle)
        tc = turns_client(client, task_queue)
        for name in ("alice", "Alice", " ALICE "):  # the client, the update, the CLI's path
            with pytest.raises(ApprovalRefused) as refused:
                await tc.review(handle.id, "e1", True, name, "mine")
            assert "requested this call and may not decide it" in refused.value.reason
        rows_now = audit(db, handle.id, "APPROVAL_REFUSED")  # audited before review returned
        decided = await tc.review(handle.id, "e1", True, "bob", "ok")
        assert decided.reviewer == "bob" and decided.arguments is None
        assert (await handle.result()).status == TurnStatus.COMPLETED
    assert len(rows_now) == 3
    for row, name in zip(rows_now, ("alice", "Alice", " ALICE "), strict=True):
        params = json.loads(row["input_params"])
        assert params["reviewer"] == name and params["door"] == "update review"
        assert "requested this call" in row["error_message"]
        assert row["tool_name"] == "createEmailTask" and "/e1/refused-" in row["execution_id"]


async def test_an_oversize_note_is_refused_before_history(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [build_sales_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        await wait_pending(handle)
        huge = "x" * 1_000_000
        why = await refused_update(handle, ReviewInput(tool_call_id="e1", reviewer="bob",
                                                       approved=True, note=huge))
        assert "bytes, over the limit of" in why
        just = "y" * (DECISION_NOTE_MAX + 1)
        assert f"characters, over the limit of {DECISION_NOTE_MAX}" in await refused_update(
            handle, ReviewInput(tool_call_id="e1", reviewer="bob", approved=True, note=just))
        # Refused before history: not recorded (the caller has the reason).
        assert (await progress(handle)).refused_signals_total == 0
        # A signal's note is cut to the limit; the decision stands.
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="bob",
                                                     comment="z" * 50_000))
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == TurnStatus.COMPLETED
    size = sum(e.ByteSize() for e in history.events)
    assert size < 200_000, size  # the 1 MB note never entered history (the signal's 50 kB did)
    note = rows(Database(f"sqlite:///{tmp_path}/t.db"), "SELECT note FROM approval_decision")
    assert len(note[0]["note"]) == DECISION_NOTE_MAX


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
async def test_approve_with_edits_sends_the_edited_mail_and_says_so(
        client: Client, task_queue: str, db: Database, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    edited = {**MAIL, "to": "sales@example.com", "subject": "Renewal reminder (final)"}
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    smtp = free_port()
    smtp_env = {"SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(smtp)}
    with LocalSmtpServer(tmp_path / "mail", port=smtp):
        async with running_worker(client, task_queue, db.url, [build_sales_service()],
                                  llm_url=fake_llm.url, env=smtp_env) as turns:
            handle = await turns.start("remind ops", service="sales-assistant", user="alice")
            [p] = await wait_pending(handle)
            assert p.arguments_digest == arguments_digest(MAIL)
            tc = turns_client(client, task_queue)
            # An edit to a recipient outside the allow-list: refused, still pending.
            with pytest.raises(ApprovalRefused) as outside:
                await tc.review(handle.id, "e1", True, "bob", arguments={
                    **MAIL, "to": "cfo@attacker.test"}, arguments_digest=p.arguments_digest)
            assert "not allowed" in outside.value.reason
            assert "attacker.test" in outside.value.reason
            with pytest.raises(ApprovalRefused) as schema:  # the tool's schema, again
                await tc.review(handle.id, "e1", True, "bob", arguments={"to": MAIL["to"]})
            assert "invalid arguments for createEmailTask" in schema.value.reason
            with pytest.raises(ApprovalRefused) as stale:
                await tc.review(handle.id, "e1", True, "bob", arguments=edited,
                                arguments_digest=arguments_digest({**MAIL, "body": "?"}))
            assert "stale" in stale.value.reason
            [still] = await wait_pending(handle)
            assert still.arguments == MAIL
            # The reviewer's complete edited arguments, through the CLI's path.
            assert await cli_review(tc, handle.id, True, "e1", "bob", "tightened",
                                    arguments=edited, digest=p.arguments_digest) == 0
            result = await handle.result()
            sent = deliver_due(turns.rt.db, Settings.from_env(
                {"DATABASE_URL": turns.rt.db.url, **smtp_env}), SenderConfig())
        mails = read_mailbox(tmp_path / "mail")
    assert result.status == TurnStatus.COMPLETED
    assert sent == 1 and len(mails) == 1
    assert mails[0]["To"] == "sales@example.com"
    assert mails[0]["Subject"] == "Renewal reminder (final)"
    # The audit: the edit, with both versions masked, and who edited.
    [row] = audit(db, handle.id, "APPROVED_WITH_EDITS")
    params = json.loads(row["input_params"])
    assert params["edited_by"] == "bob" and params["changed"] == ["subject", "to"]
    assert params["model_arguments"]["subject"] == "Renewal reminder"
    assert params["reviewer_arguments"]["subject"] == "Renewal reminder (final)"
    assert "ops@example.com" not in row["input_params"]  # masked as every audit row
    assert "sales@example.com" not in row["input_params"]
    assert "bob" in row["error_message"]
    [call_row] = audit(db, handle.id, "COMPLETED")  # what ran: the edited arguments
    assert "Renewal reminder (final)" in call_row["input_params"]
    refusals = audit(db, handle.id, "APPROVAL_REFUSED")
    assert len(refusals) == 3 and any("stale" in r["error_message"] for r in refusals)
    [decided] = rows(db, "SELECT note, edited_arguments FROM approval_decision")
    assert decided["note"] == "tightened"
    # The decision row keeps what ran, masked as the audit row (migration 0010).
    assert json.loads(decided["edited_arguments"]) == params["reviewer_arguments"]
    # The model's next request: its own call, the tool's own result, and a
    # note of its own that says what changed.
    messages = fake_llm.requests[1]["messages"]
    [asked] = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
    assert json.loads(asked["tool_calls"][0]["function"]["arguments"]) == MAIL
    [i] = [n for n, m in enumerate(messages) if m["role"] == "tool"]
    assert "edited" not in messages[i]["content"]
    assert messages[i + 1]["role"] == "user"
    told = messages[i + 1]["content"]
    assert "edited the arguments of your call e1 (createEmailTask)" in told and "'bob'" in told
    assert "'ops@example.com' -> 'sales@example.com'" in told
    assert "'Renewal reminder' -> 'Renewal reminder (final)'" in told
    decision = result.tool_calls[0]
    assert decision.status == CallStatus.COMPLETED
    assert decision.arguments["subject"] == "Renewal reminder (final)"


async def test_the_approve_signal_takes_edits_and_a_digest(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    db = Database(f"sqlite:///{tmp_path}/t.db")
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("remind ops", service="sales-assistant", user="alice")
        [p] = await wait_pending(handle)
        await handle.signal("approve", ApproveSignal(
            tool_call_id="e1", reviewer="bob", arguments_digest="f" * 64))
        await handle.signal("reject", {"tool_call_id": "e1", "reviewer": "bob",
                                       "arguments_digest": "0" * 64})
        await audited(db, handle, 2)
        await handle.signal("approve", ApproveSignal(
            tool_call_id="e1", reviewer="bob", arguments={**MAIL, "subject": "Edited"},
            arguments_digest=p.arguments_digest))
        result = await handle.result()
        pending: list[PendingApproval] = await handle.query(
            "pending_approvals", result_type=list[PendingApproval])
    assert result.status == TurnStatus.COMPLETED and pending == []
    assert all("stale" in r["error_message"] for r in audit(db, handle.id, "APPROVAL_REFUSED"))
    assert rows(db, "SELECT subject FROM email_task") == [{"subject": "Edited"}]
    assert len(audit(db, handle.id, "APPROVED_WITH_EDITS")) == 1
