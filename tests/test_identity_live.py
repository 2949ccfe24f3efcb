"""One person however the name is spelled (docs/identity.md), through a real
dev server, worker and database (SQLite and PostgreSQL): `аlice` (Cyrillic
а) cannot approve alice's e-mail, by signal or by the `review` update, and
`Alice`, `alice` and `аlice` spend one daily token budget; the usage rows
keep their spellings and are keyed by the person (migration 0009), and rows
written before it still count."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support.databases import BACKENDS, sqlite_file_url
from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
from tests.support.services import make_service
from tests.support.sql import fetchall
from tests.support.turns import running_worker, wait_pending
from turnstile.engine.contract import ApproveSignal, ReviewInput, TurnStatus
from turnstile.engine.errors import BudgetExceeded
from turnstile.engine.versions import NAMES_BY_STANDARD
from turnstile.sales.service import build_sales_service
from turnstile.stores import usage
from turnstile.stores.db import Database
from turnstile.stores.schema import upgrade
from turnstile.workflows import AgentTurn

CYRILLIC_ALICE = "\u0430lice"


@pytest.mark.live
async def test_a_look_alike_of_the_requester_cannot_approve_her_email(
        client: Client, task_queue: str, db: Database, fake_llm: FakeLLM) -> None:
    mail = {"to": "ops@example.com", "subject": "Renewal", "body": "Please renew."}
    fake_llm.script(tool_reply(("e1", "createEmailTask", mail)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="alice")
        await wait_pending(handle)
        await handle.signal("approve", ApproveSignal(tool_call_id="e1",
                                                     reviewer=CYRILLIC_ALICE))
        for spelling in ("ALICE", "\uff41lice", "al\u200dice"):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update("review", ReviewInput(
                    tool_call_id="e1", reviewer=spelling, approved=True))
            assert "may not decide" in str(refused.value.cause), refused.value.cause
        assert len(await wait_pending(handle)) == 1  # still waiting
        status = await handle.query("status", result_type=dict)
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="bob"))
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == TurnStatus.COMPLETED, result.error
    # The new rule refused what v0.3's allowed: the turn says which it followed
    # (turnstile.engine.versions.NAMES_BY_STANDARD), and replays.
    markers = [str(e.marker_recorded_event_attributes) for e in history.events
               if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert any(NAMES_BY_STANDARD in m for m in markers), markers
    replayer = Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter)
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None
    [call] = result.tool_calls
    assert call.status.value == "completed"
    refusals = json.dumps(status.get("refused_signals", status))
    assert "confusable with the requester" in refusals, refusals
    with db.connect() as conn:
        decided = fetchall(conn, "SELECT reviewer FROM approval_decision")
        audit = fetchall(conn, "SELECT status FROM tool_execution_log")
    assert [r["reviewer"] for r in decided] == ["bob"]
    assert "APPROVAL_REFUSED" in {r["status"] for r in audit}


@pytest.mark.live
async def test_every_spelling_of_a_user_spends_one_budget(
        client: Client, task_queue: str, db: Database, fake_llm: FakeLLM) -> None:
    fake_llm.default = text_reply("fine")  # 10 + 5 tokens each
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url,
                              env={"TURNSTILE_DAILY_TOKEN_BUDGET": "30"}) as turns:
        first = await turns.run("one", conversation=f"c1-{task_queue}", user="Alice")
        second = await turns.run("two", conversation=f"c2-{task_queue}", user="alice")
        third = await turns.run("three", conversation=f"c3-{task_queue}",
                                user=CYRILLIC_ALICE)
        other = await turns.run("four", conversation=f"c4-{task_queue}", user="bob")
    assert [first.status, second.status, other.status] == [TurnStatus.COMPLETED] * 3
    assert third.status == TurnStatus.REFUSED
    assert third.error is not None and third.error.type == BudgetExceeded.error_type
    assert "used 30 of 30 tokens" in third.error.message
    with db.connect() as conn:
        rows = fetchall(conn, sa.select(usage.model_usage.c.user_id, usage.model_usage.c.person)
                        .order_by(usage.model_usage.c.recorded_at))
    assert [(r["user_id"], r["person"]) for r in rows] == [
        ("Alice", "alice"), ("alice", "alice"), ("bob", "bob")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_from_before_the_person_key_still_count(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Migration 0009 keys the rows already written; a row the previous
    release's worker writes afterwards (no `person`) counts by its user id."""
    if backend == "postgresql":
        factory = request.getfixturevalue("postgres_database_factory")
        with factory() as url:
            _check_migrated_rows(Database(url))
    else:
        _check_migrated_rows(Database(sqlite_file_url(tmp_path / "u.db")))


def _check_migrated_rows(db: Database) -> None:
    upgrade(db, "0008")
    day = "2026-12-04T10:00:00.000000+00:00"
    insert = sa.text(
        "INSERT INTO model_usage (usage_key, workflow_id, run_id, call_seq, conversation_id,"
        " user_id, service, model, prompt_tokens, completion_tokens, recorded_at)"
        " VALUES (:k, 'w', 'r', :n, 'c', :u, 's', 'm', 10, 5, :at)")
    with db.connect() as conn:
        for n, user in enumerate(["Alice", CYRILLIC_ALICE, "bob"]):
            conn.sa.execute(insert, {"k": f"w/r/{n}", "n": n, "u": user, "at": day})
    upgrade(db)
    since = usage.utc_midnight(datetime.fromisoformat(day))
    with db.connect() as conn:
        keyed = fetchall(conn, "SELECT user_id, person FROM model_usage ORDER BY call_seq")
        assert [r["person"] for r in keyed] == ["alice", "alice", "bob"]
        # the previous release's worker, after the migration: no `person`
        conn.sa.execute(insert, {"k": "w/r/9", "n": 9, "u": "ALICE", "at": day})
        assert usage.tokens_since(conn, "alice", since) == 45
        assert usage.tokens_since(conn, "\uff41lice", since) == 45
        assert usage.tokens_since(conn, "bob", since) == 15
        assert usage.tokens_since(conn, "carol", since) == 0
