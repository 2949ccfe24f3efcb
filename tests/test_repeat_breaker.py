"""The repeat breaker (turnstile.engine.repeats): a small model that
calls createEmailTask again with identical arguments after it succeeded sends
no second e-mail, asks no reviewer again, and is told what the first call
returned. Real turns: the scripted model server over HTTP, a Temporal dev
server, SQLite (and PostgreSQL for the repeat after a success, the repeat in
one response and the model asked for its answer), the sender delivering over
SMTP to a local server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from tests.support.databases import BACKENDS, worker_database_url
from tests.support.processes import free_port
from tests.support.services import make_service
from tests.support.turns import running_worker, wait_pending
from turnstile.engine import attributes as attr
from turnstile.engine.breakers import BreakerPolicy, Breakers, RanCall
from turnstile.engine.contract import (
    ApproveSignal,
    CallStatus,
    PendingApproval,
    RejectSignal,
    TurnStatus,
)
from turnstile.engine.repeats import ANSWER_NOW, earlier_run, remember, repeat_key
from turnstile.engine.specs import LoopPolicy, ToolSpec
from turnstile.runtime.config import Settings
from turnstile.sales.sender import SenderConfig, deliver_due
from turnstile.sales.service import build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.sales.truth import disagreements
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.stores.schema import ensure_schema
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MAIL = {"to": "ops@example.com", "subject": "Follow up", "body": "C0001 and C0002"}
# The same arguments, spelled differently: the breaker compares JSON values.
MAIL_AGAIN = '{"body": "C0001 and C0002",  "subject": "Follow up", "to": "ops@example.com"}'


async def approve_all(handle: WorkflowHandle[Any, Any], approved: list[str]) -> None:
    """Approve every call that waits, as an auto-approving reviewer would,
    until the turn ends; `approved` collects the call ids."""
    while (await handle.describe()).close_time is None:
        pending = await handle.query("pending_approvals", result_type=list[PendingApproval])
        for p in pending:
            if p.tool_call_id not in approved:
                approved.append(p.tool_call_id)
                await handle.signal("approve", ApproveSignal(tool_call_id=p.tool_call_id,
                                                             reviewer="ops-lead"))
        await asyncio.sleep(0.05)


async def mail_turn(client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer,
                    url: str, breakers: BreakerPolicy | None = None, *,
                    one_response: bool = False) -> dict[str, Any]:
    """One sales turn on the database at `url` whose model calls
    createEmailTask twice with identical arguments (one after the other, or
    both in one response), then answers; every call approved, the outbox
    delivered. What it reports of the database is read from that database."""
    db = Database(url)
    port = free_port()
    env = {"SMTP_PORT": str(port), "SMTP_HOST": "127.0.0.1"}
    if one_response:
        fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL),
                                   ("e2", "createEmailTask", MAIL_AGAIN)),
                        text_reply("Queued the e-mail to ops@example.com."))
    else:
        fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)),
                        tool_reply(("e2", "createEmailTask", MAIL_AGAIN)),
                        text_reply("Queued the e-mail to ops@example.com."))
    service = build_sales_service()
    if breakers is not None:
        service.loop = LoopPolicy(breakers=breakers)
    approved: list[str] = []
    with LocalSmtpServer(tmp_path / "mail", port=port):
        async with running_worker(client, task_queue, url, [service], llm_url=fake_llm.url,
                                  env=env) as turns:
            handle = await turns.start("mail ops", service="sales-assistant",
                                       conversation="c-mail")
            await approve_all(handle, approved)
            result = await handle.result()
            sent = deliver_due(db, Settings.from_env({"DATABASE_URL": url, **env}),
                               SenderConfig())
        mails = read_mailbox(tmp_path / "mail")
    return {"result": result, "approved": approved, "sent": sent, "mails": mails,
            "memory": MemoryStore(db).messages("c-mail"), "audit": AuditLog(db).rows(handle.id),
            "disagreements": disagreements(db)}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_identical_email_after_success_is_not_sent_again(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    url = worker_database_url(backend, request, tmp_path)
    turn = await mail_turn(client, task_queue, tmp_path, fake_llm, url)
    result = turn["result"]
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [(c.id, c.status, c.is_error) for c in result.tool_calls] == [
        ("e1", CallStatus.COMPLETED, False), ("e2", CallStatus.REPEATED, False)]
    assert turn["approved"] == ["e1"]  # the repeat never reached a reviewer
    assert turn["sent"] == 1 and len(turn["mails"]) == 1  # one e-mail, delivered once
    # The model is told, in the result of its second call, what the first returned.
    told = tool_messages(fake_llm.requests[2])
    assert [m["tool_call_id"] for m in told] == ["e1", "e2"]
    assert told[1]["content"].startswith(
        "Not run again: createEmailTask already ran in this turn with exactly these "
        "arguments (call e1)")
    assert "QUEUED" in told[1]["content"] and "mail-" in told[1]["content"]
    stored = next(m for m in turn["memory"] if m.tool_call_id == "e2")
    assert not stored.is_error
    assert stored.attributes[attr.OUTCOME] == "repeated"
    assert stored.attributes[attr.REPEAT_OF] == "e1"
    assert [(r.tool_name, r.status) for r in turn["audit"]] == [
        ("createEmailTask", "COMPLETED"), ("createEmailTask", "REPEATED")]
    assert "e1" in (turn["audit"][1].error_message or "")
    assert turn["disagreements"] == []  # the truth check agrees with memory and the outbox


@pytest.mark.parametrize("backend", BACKENDS)
async def test_identical_calls_in_one_response_send_one_email(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    """Both in one response: the second waits for the first and, as it
    completed, is a repeat of it, never reviewed."""
    url = worker_database_url(backend, request, tmp_path)
    turn = await mail_turn(client, task_queue, tmp_path, fake_llm, url, one_response=True)
    result = turn["result"]
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [(c.id, c.status) for c in result.tool_calls] == [
        ("e1", CallStatus.COMPLETED), ("e2", CallStatus.REPEATED)]
    assert turn["approved"] == ["e1"]
    assert turn["sent"] == 1 and len(turn["mails"]) == 1
    told = tool_messages(fake_llm.requests[1])
    assert [m["tool_call_id"] for m in told] == ["e1", "e2"]
    assert "already ran in this turn" in told[1]["content"]
    assert turn["disagreements"] == []


async def test_the_twin_of_a_rejected_call_is_reviewed(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """Only a call that completed makes a repeat: the first of two identical
    calls rejected, the second waits for that, then goes to the reviewer."""
    url = f"sqlite:///{tmp_path}/sales.db"
    ensure_schema(Database(url))
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL),
                               ("e2", "createEmailTask", MAIL_AGAIN)),
                    text_reply("One e-mail queued."))
    async with running_worker(client, task_queue, url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant")
        [first] = await wait_pending(handle)
        await handle.signal("reject", RejectSignal(tool_call_id=first.tool_call_id,
                                                   reviewer="ops-lead"))
        second = first
        while second.tool_call_id == first.tool_call_id:  # until the rejection is applied
            [second] = await wait_pending(handle)
            await asyncio.sleep(0.05)
        await handle.signal("approve", ApproveSignal(tool_call_id=second.tool_call_id,
                                                     reviewer="ops-lead"))
        result = await handle.result()
    assert (first.tool_call_id, second.tool_call_id) == ("e1", "e2")
    assert [(c.id, c.status) for c in result.tool_calls] == [
        ("e1", CallStatus.REJECTED), ("e2", CallStatus.COMPLETED)]


@pytest.mark.parametrize("breakers", [BreakerPolicy(repeat_identical=False),
                                      BreakerPolicy(repeatable_tools=["createEmailTask"])],
                         ids=["breaker-off", "tool-allowed"])
async def test_policy_lets_the_repeat_run(client: Client, task_queue: str, tmp_path: Path,
                                          fake_llm: FakeOpenAIServer,
                                          breakers: BreakerPolicy) -> None:
    """Configured per service (off) or per tool: the second call runs, is
    approved on its own, and sends its own e-mail."""
    turn = await mail_turn(client, task_queue, tmp_path, fake_llm,
                           f"sqlite:///{tmp_path}/sales.db", breakers)
    result = turn["result"]
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 2
    assert turn["approved"] == ["e1", "e2"]
    assert turn["sent"] == 2 and len(turn["mails"]) == 2


async def test_a_repeatable_tool_runs_again(client: Client, task_queue: str, tmp_path: Path,
                                            fake_llm: FakeOpenAIServer) -> None:
    """A read declared `repeatable` (querySalesData) is asked again with the
    same arguments and runs again: its answer may have changed."""
    url = f"sqlite:///{tmp_path}/sales.db"
    ensure_schema(Database(url))
    query = {"startDate": "2026-01-05", "endDate": "2026-01-11", "minAmount": 50000}
    fake_llm.script(tool_reply(("q1", "querySalesData", query)),
                    tool_reply(("q2", "querySalesData", query)),
                    text_reply("No customer exceeded 50,000."))
    async with running_worker(client, task_queue, url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("who?", service="sales-assistant")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 2
    assert [r.status for r in audit] == ["COMPLETED", "COMPLETED"]  # both ran
    told = tool_messages(fake_llm.requests[2])
    assert told[0]["content"] == told[1]["content"] and "Not run again" not in told[1]["content"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_model_that_keeps_repeating_is_asked_for_its_answer(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    """The small-model loop (the same call again and again): one reservation,
    two repeats, then one request without tools for the answer; completed,
    the effect kept once."""
    def model(request: dict[str, Any]) -> dict[str, Any]:
        if "tools" not in request:
            return text_reply("Reserved the chairs.")
        return tool_reply((f"r{len(request['messages'])}", "reserve", {"item": "chairs"}))

    fake_llm.default = model
    async with running_worker(client, task_queue, worker_database_url(backend, request, tmp_path),
                              [make_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("reserve chairs")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "Reserved the chairs."
    assert [c.status for c in result.tool_calls] == [
        CallStatus.COMPLETED, CallStatus.REPEATED, CallStatus.REPEATED]
    assert [r.status for r in audit] == ["COMPLETED", "REPEATED", "REPEATED"]
    assert len(fake_llm.requests) == 4
    last = fake_llm.requests[-1]
    assert "tools" not in last and last["messages"][-1] == {"role": "user",
                                                             "content": ANSWER_NOW}


def test_what_counts_as_the_same_call() -> None:
    """Pure rules: same tool and JSON value; a repeatable tool, a failed call
    and a switched-off policy never match."""
    assert repeat_key("t", '{"a": 1, "b": [1, 2]}') == repeat_key("t", '{"b":[1,2],"a":1}')
    assert repeat_key("t", '{"a": 1}') != repeat_key("u", '{"a": 1}')
    assert repeat_key("t", '{"a": 1}') != repeat_key("t", '{"a": 1.5}')
    assert repeat_key("t", "not json") == repeat_key("t", "not json")
    writes = ToolSpec(name="t", description="", parameters={})
    reads = writes.model_copy(update={"repeatable": True})
    breakers = Breakers(BreakerPolicy())
    assert earlier_run(breakers, writes, "t", '{"a": 1}') is None  # nothing completed yet
    remember(breakers, "t", ['{"a": 1}'], RanCall("c1", "ok"))
    assert earlier_run(breakers, writes, "t", '{ "a" : 1 }') == RanCall("c1", "ok")
    assert earlier_run(breakers, writes, "t", '{"a": 2}') is None
    assert earlier_run(breakers, reads, "t", '{"a": 1}') is None
    # `idempotent` is about the same call id (a retry), not a second call: still guarded,
    # as createEmailTask (idempotent) would queue a second e-mail.
    retry_safe = writes.model_copy(update={"idempotent": True})
    assert earlier_run(breakers, retry_safe, "t", '{"a": 1}') == RanCall("c1", "ok")
    assert earlier_run(breakers, None, "t", '{"a": 1}') is None  # unknown tool: its own rule
    for policy in (BreakerPolicy(enabled=False), BreakerPolicy(repeat_identical=False),
                   BreakerPolicy(repeatable_tools=["t"])):
        off = Breakers(policy, completed=dict(breakers.completed))
        assert earlier_run(off, writes, "t", '{"a": 1}') is None
    # At their defaults the new knobs are not serialized: recorded specs read as before.
    assert "repeat_identical" not in BreakerPolicy().model_dump()
    assert "repeatable" not in writes.model_dump()
    assert reads.model_dump(exclude_defaults=True)["repeatable"] is True
    assert BreakerPolicy.model_validate({"repeat_identical": False}).repeat_identical is False


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]

