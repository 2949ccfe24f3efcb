"""A database tool writes its effect in the call journal's transaction:
the effect and its ledger, audit and memory record commit
together or not at all, whatever fails in between. On SQLite and PostgreSQL,
with the reference createFollowUpTask, its per-tool role and statement
timeout; the last test through a real turn on the dev server."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.support.sql import fetchone
from tests.support.turns import running_worker
from turnstile.engine.activity_io import EXECUTE_TOOL
from turnstile.engine.contract import AuditStatus, CallStatus, TurnStatus
from turnstile.engine.errors import CallTakenOver, MemoryConflictError
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.runtime.tools import ToolContext, result_to_text
from turnstile.sales import truth
from turnstile.sales.access import tool_transaction
from turnstile.sales.sales_tools import createFollowUpTask
from turnstile.sales.schema import FOLLOWUP_ROLE, utc_text
from turnstile.sales.service import build_sales_service
from turnstile.stores.audit import AuditLog, execution_id
from turnstile.stores.db import Database
from turnstile.stores.journal import CallJournal, Ending, Start
from turnstile.stores.memory import MemoryStore
from turnstile.stores.transaction import Transaction, TransactionEnded
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

ARGS = {"customerIds": ["C0001"], "assignee": "ops@example.com", "note": "call them"}


@pytest.fixture
def sales_db(db: Database) -> Database:
    # Yesterday: inside the 90 days the tools' reader may see on PostgreSQL.
    when = utc_text(datetime.now(UTC) - timedelta(days=1))
    with db.connect() as conn:
        conn.execute("INSERT INTO sales_record VALUES (1, 'C0001', 'Name', 'c@example.com', "
                     "100, :when)", {"when": when})
    return db


class Attempt:
    """One attempt of a createFollowUpTask call, as activities.tool_calls runs it."""

    def __init__(self, db: Database, wf: str, conv: str) -> None:
        self.db, self.wf, self.conv = db, wf, conv
        self.journal = CallJournal(db, MemoryStore(db))
        self.call = ToolCall(id="call_0", name="createFollowUpTask", arguments=json.dumps(ARGS))
        MemoryStore(db).check_owner(conv, "alice")
        self.claim = self.journal.begin(
            Start(workflow_id=wf, chain="run-1", conversation_id=conv, user_id="alice",
                  call=self.call), rerun_lost=True).attempts
        self.tx = self.journal.transaction()

    async def run_tool(self) -> str:
        ctx = ToolContext(db=self.db, workflow_id=self.wf, conversation_id=self.conv,
                          user_id="alice", tool_call_id=self.call.id, execution_chain="run-1",
                          journal_tx=self.tx)
        return result_to_text(await createFollowUpTask.invoke(
            ctx, createFollowUpTask.parse_arguments(self.call.arguments)))

    def finish(self, text: str, seq: int) -> None:
        try:
            self.journal.finish(Ending(
                workflow_id=self.wf, chain="run-1", conversation_id=self.conv,
                user_id="alice", call=self.call, seq=seq, outcome=CallStatus.COMPLETED,
                text=text, is_error=False, audit_status=AuditStatus.COMPLETED,
                attempt=self.claim), self.tx)
        finally:
            self.tx.release()


def facts(db: Database, wf: str) -> dict[str, Any]:
    key = execution_id(wf, "call_0", "run-1")
    with db.connect() as conn:
        def one(sql: str) -> Any:
            row = fetchone(conn, sql, {"wf": wf, "k": key})
            return None if row is None else next(iter(row.values()))

        return {"follow_ups": one("SELECT COUNT(*) FROM follow_up_task WHERE created_by_call = :k"),
                "ledger": one("SELECT status FROM tool_call_ledger WHERE workflow_id = :wf"),
                "audit": one("SELECT status FROM tool_execution_log WHERE execution_id = :k"),
                "results": one("SELECT COUNT(*) FROM chat_message WHERE workflow_id = :wf")}


def ids() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"wf-{tag}", f"c-{tag}"


async def test_the_effect_commits_with_its_record(sales_db: Database) -> None:
    wf, conv = ids()
    attempt = Attempt(sales_db, wf, conv)
    text = await attempt.run_tool()
    # Written on the journal's connection, not committed: nobody else sees it.
    assert facts(sales_db, wf) == {"follow_ups": 0, "ledger": "STARTED", "audit": "INITIATED",
                                   "results": 0}
    attempt.finish(text, seq=1)
    assert facts(sales_db, wf) == {"follow_ups": 1, "ledger": "COMPLETED", "audit": "COMPLETED",
                                   "results": 1}
    assert truth.disagreements(sales_db, conv) == []


async def test_a_record_that_fails_takes_the_effect_with_it(sales_db: Database) -> None:
    wf, conv = ids()
    MemoryStore(sales_db).put(conv, 1, ChatMessage(role="user", content="x"), "another-turn")
    attempt = Attempt(sales_db, wf, conv)
    text = await attempt.run_tool()
    with pytest.raises(MemoryConflictError):  # the record's last write fails
        attempt.finish(text, seq=1)
    # The ledger and audit writes before it rolled back too, the effect with them.
    assert facts(sales_db, wf) == {"follow_ups": 0, "ledger": "STARTED", "audit": "INITIATED",
                                   "results": 0}

    again = Attempt(sales_db, wf, conv)  # the retry finds nothing and runs the call again
    assert again.claim == 2
    again.finish(await again.run_tool(), seq=2)
    assert facts(sales_db, wf) == {"follow_ups": 1, "ledger": "COMPLETED", "audit": "COMPLETED",
                                   "results": 1}


async def test_an_attempt_whose_call_was_claimed_again_records_nothing(
        sales_db: Database) -> None:
    """The server gave up on attempt 1 (heartbeat timeout) while it still ran:
    attempt 2 claims the call; attempt 1's commit is refused, its effect
    rolls back, and only attempt 2's is kept. (On SQLite attempt 1's
    transaction holds the write lock: attempt 2 cannot claim the call before
    it ends.)"""
    if sales_db.dialect != "postgresql":
        pytest.skip("SQLite serializes the two attempts on its write lock")
    wf, conv = ids()
    first = Attempt(sales_db, wf, conv)
    text = await first.run_tool()
    second = Attempt(sales_db, wf, conv)
    with pytest.raises(CallTakenOver):
        first.finish(text, seq=1)
    assert facts(sales_db, wf)["follow_ups"] == 0
    second.finish(await second.run_tool(), seq=1)
    assert facts(sales_db, wf) == {"follow_ups": 1, "ledger": "COMPLETED", "audit": "COMPLETED",
                                   "results": 1}


async def test_a_cancelled_attempt_never_records_without_its_effect(sales_db: Database) -> None:
    """The activity was cancelled while its tool still ran in a thread: it
    releases the transaction; the thread's writes roll back as it leaves its
    block, nothing can use the transaction again, and a record that would
    have joined it is refused rather than written alone."""
    wf, conv = ids()
    attempt = Attempt(sales_db, wf, conv)
    inside, leave = threading.Event(), threading.Event()

    def tool_thread() -> None:
        with attempt.tx.use() as conn:
            conn.execute("INSERT INTO follow_up_task (customer_id, assignee, note, "
                         "created_by_call, created_at) VALUES ('C0001', 'a', 'n', :k, 't')",
                         {"k": execution_id(wf, "call_0", "run-1")})
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=tool_thread)
    thread.start()
    assert inside.wait(10)
    attempt.tx.release()  # the cancelled activity's `finally`
    leave.set()
    thread.join(10)
    with pytest.raises(TransactionEnded):
        attempt.finish("{}", seq=1)
    assert facts(sales_db, wf) == {"follow_ups": 0, "ledger": "STARTED", "audit": "INITIATED",
                                   "results": 0}


def test_the_tool_role_and_timeout_end_with_its_block(sales_db: Database) -> None:
    if sales_db.dialect != "postgresql":
        pytest.skip("roles and statement_timeout are PostgreSQL's")
    tx = Transaction(sales_db)
    ctx = ToolContext(db=sales_db, workflow_id="wf", conversation_id="c", user_id="u",
                      tool_call_id="t", statement_timeout_seconds=1.5, journal_tx=tx)
    who = "SELECT current_user AS u, current_setting('statement_timeout') AS t"
    try:
        with tx.use() as conn:
            before = fetchone(conn, who)
        with tool_transaction(ctx, FOLLOWUP_ROLE) as conn:
            assert fetchone(conn, who) == {"u": FOLLOWUP_ROLE, "t": "1500ms"}
        with tx.use() as conn:  # the journal's writes that follow: the application's
            assert fetchone(conn, who) == before
    finally:
        tx.release()


@contextmanager
def refusing_follow_up_results(db: Database) -> Iterator[None]:
    """A real database error in the record's last write: storing a
    createFollowUpTask result in memory violates a constraint."""
    if db.dialect == "postgresql":
        add = ("ALTER TABLE chat_message ADD CONSTRAINT test_refuse_follow_up CHECK "
               "(role <> 'tool' OR content NOT LIKE '%\"followUpTasks\"%')")
        drop = "ALTER TABLE chat_message DROP CONSTRAINT test_refuse_follow_up"
    else:
        add = ("CREATE TRIGGER test_refuse_follow_up BEFORE INSERT ON chat_message WHEN "
               "NEW.role = 'tool' AND NEW.content LIKE '%\"followUpTasks\"%' "
               "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
        drop = "DROP TRIGGER test_refuse_follow_up"
    with db.connect() as conn:
        conn.execute(add)
    try:
        yield
    finally:
        with db.connect() as conn:
            conn.execute(drop)


async def test_a_turn_whose_record_fails_leaves_no_follow_up(
        client: Client, task_queue: str, sales_db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("f1", "createFollowUpTask", ARGS)),
                    text_reply("I could not create the follow-up"))
    conv = f"c-refused-{uuid.uuid4().hex[:6]}"
    with refusing_follow_up_results(sales_db):
        async with running_worker(client, task_queue, sales_db.url, [build_sales_service()],
                                  llm_url=fake_llm.url) as turns:
            handle = await turns.start("follow up C0001", service="sales-assistant",
                                       conversation=conv)
            result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.FAILED]
    history = await handle.fetch_history()
    tool_runs = {e.event_id for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name == EXECUTE_TOOL}
    [started] = [e.activity_task_started_event_attributes for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
                 and e.activity_task_started_event_attributes.scheduled_event_id in tool_runs]
    failure = started.last_failure if started.attempt > 1 else None
    if sales_db.dialect == "postgresql":
        # A CHECK violation is the data refused: the same on every attempt, so
        # never retried (activities.data_errors); the tool's one attempt ran it
        # and failed to record it.
        attempts = 1
        events = [e for e in history.events
                  if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
        [failed] = [e.activity_task_failed_event_attributes.failure for e in events]
        assert failed.application_failure_info.type == "DatabaseRefusedData"
        assert failed.application_failure_info.non_retryable
        assert "CHECK constraint" in failed.message
        assert "INSERT" not in str(failed)  # the driver's text stays in the log
    else:
        # A trigger's abort names no data rule: each of the tool's three
        # attempts ran it, then failed to record it.
        attempts = 3
        assert started.attempt == 3 and failure is not None
        assert failure.application_failure_info.type == "CallNotRecorded"
        assert "a constraint" in failure.message
        assert "INSERT" not in str(failure)  # the driver's text stays in the log
    with sales_db.connect() as conn:
        assert fetchone(conn, "SELECT COUNT(*) AS n FROM follow_up_task WHERE "
                              "created_by_call LIKE :k", {"k": handle.id + "/%"}) == {"n": 0}
        ledger = fetchone(conn, "SELECT status, attempts FROM tool_call_ledger "
                                "WHERE workflow_id = :wf", {"wf": handle.id})
    assert ledger == {"status": "STARTED", "attempts": attempts}
    assert [r.status for r in AuditLog(sales_db).rows(handle.id)] == ["FAILED"]
    assert truth.disagreements(sales_db, conv) == []
