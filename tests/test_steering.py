"""A new message while a turn waits for an approval (docs/steering.md), through
a real dev server and worker, on SQLite and PostgreSQL: `steer` (the reference
service's choice) rejects the waiting call and the new turn runs at once;
`queue` waits, visibly; `refuse` ends the new turn `refused`. The model is the
strict scripted endpoint (turnstile.testing.FakeOpenAIServer), the mail a real SMTP
server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Replayer

from tests.support.processes import free_port
from tests.support.sql import fetchall
from tests.support.turns import running_worker, wait_pending
from turnstile.client import TurnstileClient
from turnstile.engine.contract import (
    ApproveSignal,
    CallStatus,
    Handlers,
    RejectSignal,
    SteerSignal,
    TurnPhase,
    TurnProgress,
    TurnResult,
    TurnStatus,
)
from turnstile.engine.errors import ConfigurationError
from turnstile.runtime.config import Settings
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.sales.sender import SenderConfig, deliver_due
from turnstile.sales.service import build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.workflows import AgentTurn

NEW_MESSAGE = "the user sent a new message"
SA_STATUS = SearchAttributeKey.for_keyword("TurnstileStatus")


def mail(cid: str, subject: str) -> dict[str, Any]:
    return tool_reply((cid, "createEmailTask", {"to": "ops@example.com", "subject": subject,
                                                "body": "Please follow up."}))


def decisions(db: Database, wf_id: str) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, "SELECT tool_call_id, approved, reviewer, note "
                              "FROM approval_decision WHERE workflow_id = :w", {"w": wf_id})


def mail_rows(db: Database, wf_id: str) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, "SELECT subject, status FROM email_task "
                              "WHERE idempotency_key LIKE :key", {"key": wf_id + "/%"})


async def progress(handle: WorkflowHandle[Any, Any]) -> TurnProgress:
    result: TurnProgress = await handle.query(Handlers.STATUS, result_type=TurnProgress)
    return result


async def approve_all(handle: WorkflowHandle[Any, Any]) -> None:
    for p in await wait_pending(handle):
        await handle.signal(Handlers.APPROVE, ApproveSignal(tool_call_id=p.tool_call_id,
                                                            reviewer="ops-lead"))


async def test_a_new_message_steers_a_turn_waiting_for_an_approval(
        client: Client, task_queue: str, tmp_path, db: Database,
        fake_llm: FakeOpenAIServer) -> None:
    """The waiting call is rejected "the user sent a new message" (audited, no
    mail), the waiting turn ends `steered` without asking the model again, and
    the new turn's first model request comes within 2 s of its start, with
    memory a strict endpoint accepts."""
    first_request: list[float] = []

    def new_turn_asks(request: dict[str, Any]) -> dict[str, Any]:
        first_request.append(time.monotonic())
        return mail("e2", "New subject")

    fake_llm.script(mail("e1", "Old subject"), new_turn_asks, text_reply("Queued the new mail."))
    port = free_port()
    env = {"SMTP_PORT": str(port), "SMTP_HOST": "127.0.0.1"}
    with LocalSmtpServer(tmp_path / "mail", port=port):
        async with running_worker(client, task_queue, db.url, [build_sales_service()],
                                  llm_url=fake_llm.url, env=env) as turns:
            waiting = await turns.start("mail ops", service="sales-assistant",
                                        conversation="c-steer")
            [parked] = await wait_pending(waiting)
            started = time.monotonic()
            new = await turns.start("no wait: use the subject 'New subject'",
                                    service="sales-assistant", conversation="c-steer")
            steered = await waiting.result()
            await approve_all(new)
            answered = await new.result()
            held = await progress(waiting)
            replayed = [await replays(h) for h in (waiting, new)]
            audit = AuditLog(db).rows(waiting.id)
            decided = decisions(db, waiting.id)
            memory = MemoryStore(db).messages("c-steer")
            old_mail, new_mail = mail_rows(db, waiting.id), mail_rows(db, new.id)
            sent = deliver_due(db, Settings.from_env({"DATABASE_URL": db.url, **env}),
                               SenderConfig())
        mailbox = read_mailbox(tmp_path / "mail")
    assert parked.tool_call_id == "e1"
    # The waiting turn: a defined, typed ending; its call rejected, not run.
    assert steered.status == TurnStatus.STEERED, steered.error
    assert steered.error is not None and steered.error.type == "TurnSteered"
    assert NEW_MESSAGE in steered.error.message and new.id in steered.error.message
    assert [(c.id, c.status) for c in steered.tool_calls] == [("e1", CallStatus.REJECTED)]
    assert any(e.step == "steered" for e in held.events)
    assert replayed == [None, None]  # both histories replay with today's code
    # It never asked the model again: three requests, its own first and the new turn's two.
    assert len(fake_llm.requests) == 3 and fake_llm.refusals == []
    assert [(r.tool_name, r.status) for r in audit] == [("createEmailTask", "FAILED")]
    assert NEW_MESSAGE in (audit[0].error_message or "")
    assert [(d["tool_call_id"], bool(d["approved"]), d["reviewer"], d["note"])
            for d in decided] == [("e1", False, "alice", NEW_MESSAGE)]
    # The new turn ran at once and saw all of it.
    assert answered.status == TurnStatus.COMPLETED, answered.error
    assert first_request and first_request[0] - started < 2.0, first_request[0] - started
    request = fake_llm.requests[1]["messages"]
    told = next(m for m in request if m.get("tool_call_id") == "e1")
    assert NEW_MESSAGE in told["content"] and "did not run" in told["content"]
    assert request[-1]["role"] == "user" and "New subject" in request[-1]["content"]
    assert [m.role for m in memory if m.role != "system"] == [
        "user", "assistant", "tool", "user", "assistant", "tool", "assistant"]
    # No mail for the rejected call; the new turn's mail went out.
    assert old_mail == [] and [m["subject"] for m in new_mail] == ["New subject"]
    assert sent == 1 and [m["Subject"] for m in mailbox] == ["New subject"]


async def test_a_decision_that_came_first_wins_and_a_second_new_message_queues(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    """Races: the reviewer approved before the new message arrived (the steer is
    ignored, the new turn waits for the lock); two new messages at once steer
    the waiting turn once, and the second runs after the first."""
    fake_llm.script(mail("e1", "One"), text_reply("Mail one queued."))
    fake_llm.default = text_reply("Noted.")
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        # 1. A decision first: the approve signal precedes the steer in history.
        waiting = await turns.start("mail one", service="sales-assistant", conversation="c-r")
        [p] = await wait_pending(waiting)
        await waiting.signal(Handlers.APPROVE, ApproveSignal(tool_call_id=p.tool_call_id,
                                                             reviewer="ops-lead"))
        await waiting.signal(Handlers.STEER, SteerSignal(turn_id="t-manual", user_id="alice"))
        late = await turns.start("and thanks", service="sales-assistant", conversation="c-r")
        decided = await waiting.result()
        after = await late.result()
        ignored = [e.detail for e in (await progress(waiting)).events
                   if e.step == "steer_ignored"]
        # 2. Two new messages at once.
        fake_llm.script(mail("e2", "Two"))
        waiting2 = await turns.start("mail two", service="sales-assistant", conversation="c-r")
        await wait_pending(waiting2)
        a, b = await asyncio.gather(
            turns.start("first new message", service="sales-assistant", conversation="c-r"),
            turns.start("second new message", service="sales-assistant", conversation="c-r"))
        steered = await waiting2.result()
        ra, rb = await asyncio.gather(a.result(), b.result())
        events = (await progress(waiting2)).events
        memory = MemoryStore(db).messages("c-r")
    assert decided.status == TurnStatus.COMPLETED and decided.tool_calls[0].status == "completed"
    assert ignored and "no call waits for a decision" in ignored[0]
    assert after.status == TurnStatus.COMPLETED
    assert steered.status == TurnStatus.STEERED
    assert [e.step for e in events].count("steered") == 1
    assert ra.status == rb.status == TurnStatus.COMPLETED
    assert fake_llm.refusals == []
    # One result for each call, the rejected one included.
    calls = [c.id for m in memory for c in m.tool_calls]
    results = [m.tool_call_id for m in memory if m.role == "tool"]
    assert sorted(calls) == sorted(results) == ["e1", "e2"]


async def test_queue_waits_visibly_behind_the_turn_waiting_for_an_approval(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(mail("e1", "One"), text_reply("Mail queued."), text_reply("Hello."))
    service = build_sales_service()
    service.on_new_message = "queue"
    async with running_worker(client, task_queue, db.url, [service],
                              llm_url=fake_llm.url) as turns:
        waiting = await turns.start("mail one", service="sales-assistant", conversation="c-q")
        await wait_pending(waiting)
        queued = await turns.start("hello?", service="sales-assistant", conversation="c-q")
        seen = await _queued_status(queued)
        handle = TurnstileClient(client, turns.rt.settings).turn(queued.id)
        said = (await handle.status()).queued_behind
        attribute = (await queued.describe()).typed_search_attributes.get(SA_STATUS)
        still = await wait_pending(waiting)  # the waiting turn is untouched
        await approve_all(waiting)
        first, second = await waiting.result(), await queued.result()
        replayed = await replays(queued)
    behind = f"queued behind turn {waiting.id}, waiting for an approval"
    assert seen.step == TurnPhase.QUEUED and seen.queued_behind == behind
    assert said == behind and attribute == TurnPhase.QUEUED
    assert [p.tool_call_id for p in still] == ["e1"]
    assert first.status == TurnStatus.COMPLETED and first.tool_calls[0].status == "completed"
    assert second.status == TurnStatus.COMPLETED, second.error
    assert fake_llm.refusals == [] and replayed is None


async def test_refuse_ends_the_new_turn_at_once(client: Client, task_queue: str, db: Database,
                                                fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(mail("e1", "One"), text_reply("Not sent."))
    service = build_sales_service()
    service.on_new_message = "refuse"
    async with running_worker(client, task_queue, db.url, [service],
                              llm_url=fake_llm.url) as turns:
        waiting = await turns.start("mail one", service="sales-assistant", conversation="c-x")
        await wait_pending(waiting)
        started = time.monotonic()
        refused: TurnResult = await turns.run("hello?", service="sales-assistant",
                                              conversation="c-x")
        took = time.monotonic() - started
        still = await wait_pending(waiting)
        [p] = still
        await waiting.signal(Handlers.REJECT, RejectSignal(tool_call_id=p.tool_call_id,
                                                           reviewer="ops-lead", reason="no"))
        first = await waiting.result()
        memory = MemoryStore(db).messages("c-x")
    assert refused.status == TurnStatus.REFUSED
    assert refused.error is not None and refused.error.type == "NewMessageRefused"
    assert waiting.id in refused.error.message and "approval" in refused.error.message
    assert took < 5.0, took
    assert first.status == TurnStatus.COMPLETED
    assert not any("hello?" in (m.content or "") for m in memory)  # the refused turn held nothing


def test_an_unknown_policy_is_a_configuration_error() -> None:
    try:
        Service(name="s", tools=ToolRegistry([]), on_new_message="interrupt")  # type: ignore[arg-type]
    except ConfigurationError as exc:
        assert "steer, queue, refuse" in str(exc)
    else:
        raise AssertionError("an unknown on_new_message was accepted")


async def replays(handle: WorkflowHandle[Any, Any]) -> BaseException | None:
    """Replay a turn's history with today's workflow code: its failure, or None."""
    history = await handle.fetch_history()
    replayer = Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter)
    return (await replayer.replay_workflow(history, raise_on_replay_failure=False)
            ).replay_failure


async def _queued_status(handle: WorkflowHandle[Any, Any]) -> TurnProgress:
    for _ in range(200):
        try:
            seen = await progress(handle)
        except (RPCError, WorkflowQueryFailedError):  # no workflow task has run yet
            seen = None
        if seen is not None and seen.step == TurnPhase.QUEUED:
            return seen
        await asyncio.sleep(0.05)
    raise TimeoutError("the new turn never said it was queued")
