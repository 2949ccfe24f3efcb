"""Usage you can account for: each model call's model and tokens in
`model_usage` (turnstile.stores.usage), summed by `starter.py usage`, and the
per-user daily token budget (TURNSTILE_DAILY_TOKEN_BUDGET) that refuses a
turn with `BudgetExceeded` — real dev server, the scripted model over HTTP,
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support.services import make_service
from tests.support.sql import fetchall, fetchone
from tests.support.turns import running_worker
from turnstile.engine.contract import TurnStatus
from turnstile.engine.errors import BudgetExceeded, ConfigurationError
from turnstile.runtime.config import Settings
from turnstile.stores import usage
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.workflows import AgentTurn

ROOT = Path(__file__).resolve().parents[1]


def costing(reply: dict[str, Any], prompt: int, completion: int) -> dict[str, Any]:
    """`reply` reporting its own usage."""
    return {**reply, "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def rows(db: Database, **where: str) -> list[dict[str, Any]]:
    c = usage.model_usage.c
    stmt = sa.select(usage.model_usage).where(
        *(c[k] == v for k, v in where.items())).order_by(c.call_seq)
    with db.connect() as conn:
        return fetchall(conn, stmt)


def starter(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": db.url}
    return subprocess.run([sys.executable, str(ROOT / "starter.py"), "usage", *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def json_lines(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def summed(user: str, service: str, model: str, turns: int, calls: int, prompt: int,
           completion: int) -> dict[str, Any]:
    return {"user_id": user, "service": service, "model": model, "turns": turns,
            "model_calls": calls, "prompt_tokens": prompt, "completion_tokens": completion}


@pytest.mark.live
async def test_model_calls_are_recorded_once_and_summed_by_the_cli(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(costing(tool_reply(("call-1", "add", {"a": 2, "b": 3})), 11, 7),
                    costing(text_reply("2 + 3 = 5"), 23, 4),
                    text_reply("other service"), text_reply("bob's answer"))
    async with running_worker(client, task_queue, db.url, [make_service(),
                                                          make_service("other")],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("add 2 and 3", conversation="c-usage-a", user="alice")
        first = await handle.result()
        other = await turns.run("hi", conversation="c-usage-o", user="alice",
                                service="other")
        bob = await turns.run("hi", conversation="c-usage-b", user="bob")
    assert [first.status, other.status, bob.status] == [TurnStatus.COMPLETED] * 3, first.error

    # The 2-call turn: one row per call, as the model reported it.
    recorded = rows(db, workflow_id=handle.id)
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in recorded] == [(11, 7), (23, 4)]
    assert {(r["user_id"], r["service"], r["model"], r["conversation_id"], r["run_id"])
            for r in recorded} == {("alice", "test", "fake", "c-usage-a",
                                    handle.result_run_id)}
    # Each keyed by the memory slot its answer took: the assistant messages.
    stored = MemoryStore(db).messages("c-usage-a")
    answers = [i for i, m in enumerate(stored) if m.role == "assistant"]
    assert [r["call_seq"] for r in recorded] == answers
    assert first.usage.prompt_tokens == 34 and first.usage.completion_tokens == 11
    assert datetime.fromisoformat(recorded[0]["recorded_at"]) > datetime.now(UTC) - timedelta(
        minutes=5)

    # A retried attempt records the same call again: nothing changes.
    again = usage.ModelCall(
        workflow_id=handle.id, run_id=recorded[0]["run_id"], call_seq=recorded[0]["call_seq"],
        conversation_id="c-usage-a", user_id="alice", service="test", model="fake",
        prompt_tokens=999, completion_tokens=999)
    with db.connect() as conn:
        assert usage.record(conn, again) is False
    assert rows(db, workflow_id=handle.id) == recorded

    # A call from last month, outside a --since window.
    old = datetime.now(UTC) - timedelta(days=30)
    with db.connect() as conn:
        assert usage.record(conn, usage.ModelCall(
            workflow_id="t-old", run_id="r-old", call_seq=1, conversation_id="c-old",
            user_id="bob", service="test", model="old-model", prompt_tokens=100,
            completion_tokens=100), recorded_at=usage.stored_time(old))

    everything = json_lines(starter(db, "--json"))
    assert everything == [
        summed("bob", "test", "old-model", 1, 1, 100, 100),
        summed("alice", "test", "fake", 1, 2, 34, 11),
        summed("alice", "other", "fake", 1, 1, 10, 5),
        summed("bob", "test", "fake", 1, 1, 10, 5),
    ]
    assert json_lines(starter(db, "--since", "7d", "--json")) == everything[1:]
    assert json_lines(starter(db, "--user", "bob", "--json")) == [everything[0], everything[3]]
    assert json_lines(starter(db, "--service", "other", "--json")) == [everything[2]]
    assert json_lines(starter(db, "--user", "alice", "--service", "test", "--since",
                              (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
                              "--json")) == [everything[1]]

    table = starter(db, "--since", "7d")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("3 row(s), since ")
    assert lines[1].split() == list(usage.SUMMARY_COLUMNS)
    assert [line.split() for line in lines[2:]] == [
        ["alice", "test", "fake", "1", "2", "34", "11"],
        ["alice", "other", "fake", "1", "1", "10", "5"],
        ["bob", "test", "fake", "1", "1", "10", "5"],
        ["total", "3", "4", "54", "21"],
    ]
    # Aligned: every number ends where its heading does.
    for name in ("turns", "prompt_tokens", "completion_tokens"):
        end = lines[1].index(name) + len(name)
        assert all(line[end - 1].isdigit() and (len(line) == end or line[end] == " ")
                   for line in lines[2:]), name
    assert starter(db, "--user", "nobody").stdout == "0 row(s), all time\n"
    bad = starter(db, "--since", "last week")
    assert bad.returncode == 2 and "duration such as 1h" in bad.stderr


def locks(db: Database, conversation: str) -> int:
    with db.connect() as conn:
        row = fetchone(conn, "SELECT COUNT(*) AS n FROM conversation_lock "
                             "WHERE conversation_id = :c", {"c": conversation})
    assert row is not None
    return int(row["n"])


@pytest.mark.live
async def test_a_spent_budget_refuses_the_turn_and_releases_the_conversation(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    conv = f"c-budget-{task_queue}"
    fake_llm.default = text_reply("fine")  # 10 + 5 tokens each
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url,
                              env={"TURNSTILE_DAILY_TOKEN_BUDGET": "15"}) as turns:
        first = await turns.run("one", conversation=conv, user="carol")
        handle = await turns.start("two", conversation=conv, user="carol")
        refused = await handle.result()
    assert first.status == TurnStatus.COMPLETED, first.error
    assert refused.status == TurnStatus.REFUSED
    assert refused.error is not None and refused.error.type == BudgetExceeded.error_type
    assert refused.error.message == "user carol used 15 of 15 tokens today"
    assert len(fake_llm.requests) == 1  # the refused call never reached the model
    assert locks(db, conv) == 0  # released
    assert len(rows(db, user_id="carol")) == 1
    # The model call failed once, for good (not retried); the turn's history
    # carries no patch marker (REFUSING_ERRORS: a new error type) and replays.
    history = await handle.fetch_history()
    failed = [e for e in history.events
              if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
    assert len(failed) == 1
    assert failed[0].activity_task_failed_event_attributes.failure.application_failure_info \
        .non_retryable
    patches = [str(e.marker_recorded_event_attributes) for e in history.events
               if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
               and e.marker_recorded_event_attributes.marker_name == "core_patch"]
    assert patches == []
    replayer = Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter)
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None

    # A raised budget, then none at all: the same conversation goes on.
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url,
                              env={"TURNSTILE_DAILY_TOKEN_BUDGET": "1000"}) as turns:
        third = await turns.run("three", conversation=conv, user="carol")
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        fourth = await turns.run("four", conversation=conv, user="carol")
    assert [third.status, fourth.status] == [TurnStatus.COMPLETED] * 2, (third.error,
                                                                          fourth.error)
    assert len(rows(db, user_id="carol")) == 3
    assert locks(db, conv) == 0


def test_budget_setting() -> None:
    assert Settings.from_env({}).daily_token_budget is None
    assert Settings.from_env({"TURNSTILE_DAILY_TOKEN_BUDGET": ""}).daily_token_budget is None
    assert Settings.from_env({"TURNSTILE_DAILY_TOKEN_BUDGET": "10_000"}) \
        .daily_token_budget == 10_000
    assert Settings.from_env({"TURNSTILE_DAILY_TOKEN_BUDGET": "0"}).daily_token_budget == 0
    for bad in ("lots", "-5", "1.5"):
        with pytest.raises(ConfigurationError, match="TURNSTILE_DAILY_TOKEN_BUDGET"):
            Settings.from_env({"TURNSTILE_DAILY_TOKEN_BUDGET": bad})
    assert str(BudgetExceeded.spent("alice", 12_345, 10_000)) == \
        "user alice used 12,345 of 10,000 tokens today"


def test_the_budget_day_starts_at_utc_midnight(db: Database) -> None:
    now = datetime(2026, 12, 1, 0, 30, tzinfo=UTC)
    midnight = usage.utc_midnight(now)
    assert midnight == datetime(2026, 12, 1, tzinfo=UTC)
    with db.connect() as conn:
        for seq, at in enumerate((midnight - timedelta(seconds=1), midnight,
                                  now - timedelta(minutes=1))):
            usage.record(conn, usage.ModelCall(
                workflow_id="t", run_id="r", call_seq=seq, conversation_id="c",
                user_id="dave", service="s", model="m", prompt_tokens=100 * (seq + 1),
                completion_tokens=1), recorded_at=usage.stored_time(at))
        assert usage.tokens_since(conn, "dave", midnight) == 200 + 1 + 300 + 1
        assert usage.tokens_since(conn, "erin", midnight) == 0
