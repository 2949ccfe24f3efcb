"""`python starter.py check`: memory, journal, audit, approvals and the world
tables agree after real turns (exit 0), and every planted disagreement is
printed (exit 1). A conversation whose lock holder ended is checked; one a
running turn holds is skipped and listed. On SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker, wait_pending
from tests.test_sales_turns import DEMO, TODAY, approve_when_asked
from turnstile.cli import starter
from turnstile.engine.contract import TurnStatus
from turnstile.sales.planner import demo_planner
from turnstile.sales.seed import seed
from turnstile.sales.service import build_sales_service
from turnstile.stores.audit import execution_id
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


async def test_check_agrees_after_turns_and_finds_planted_lies(
        client: Client, task_queue: str, db: Database, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    seed(db, rows=2000, today=TODAY)
    conv = f"c-check-{uuid.uuid4().hex[:6]}"
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              provider=demo_planner(today=lambda: TODAY)) as turns:
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
        # The crash: the effect committed, the ledger still says STARTED.
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


async def test_check_sees_a_terminated_turn_and_skips_a_running_one(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A turn terminated while it waits for approval keeps its
    conversation's lock row; `check` asks Temporal about the holder, checks
    the conversation and names the call awaiting repair (exit 1). A turn still
    running is skipped and listed. After the next turn repairs the
    conversation, `check` is clean for it (exit 0)."""
    ended, waiting = (f"c-{k}-{uuid.uuid4().hex[:6]}" for k in ("ended", "waiting"))
    fake_llm.script(tool_reply(("call_1", "sendMoneySlowly", {"to": "bob", "amount": 5})),
                    tool_reply(("call_9", "sendMoneySlowly", {"to": "eve", "amount": 1})),
                    text_reply("nothing was paid"))
    monkeypatch.setenv("DATABASE_URL", db.url)
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        stuck = await turns.start("pay bob", conversation=ended)
        await wait_pending(stuck)
        running = await turns.start("pay eve", conversation=waiting)
        await wait_pending(running)
        await stuck.terminate("operator gave up")  # no workflow code runs: the lock stays
        capsys.readouterr()
        broken = await starter.main(["check"], client=client)
        before = capsys.readouterr().out.splitlines()
        nxt = await turns.run("did you pay?", conversation=ended)
        repaired = await starter.main(["check", "--conversation", ended], client=client)
        after = capsys.readouterr().out.splitlines()
        everything = await starter.main(["check"], client=client)
        still = capsys.readouterr().out.splitlines()
        await running.terminate("test over")
    assert broken == 1, before
    assert (f"conversation {ended}: call call_1 (sendMoneySlowly) of turn {stuck.id} has no "
            "result in memory") in before
    assert (f"awaits repair: conversation {ended}: its lock holder, turn {stuck.id}, is no "
            f"longer running (TERMINATED); calls without a result: "
            f"call_1 (sendMoneySlowly) of turn {stuck.id}; audit rows left INITIATED: none"
            ) in before
    skipped = f"skipped: conversation {waiting}: held by running turn {running.id}"
    assert skipped in before
    # The running turn's open call is in flight, not a disagreement.
    assert [line for line in before if waiting in line] == [skipped]
    assert before[-1] == "1 disagreement(s)"
    assert nxt.status == TurnStatus.COMPLETED, nxt.error
    assert (repaired, after) == (0, ["0 disagreement(s)"])
    assert (everything, still) == (0, [skipped, "0 disagreement(s)"])


async def test_check_of_locks_whose_holder_temporal_never_saw_or_cannot_say(
        client: Client, db: Database, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A lock held by a workflow Temporal does not know (retention ended, a
    restored database) is an ended holder: its conversation is checked, the
    open audit row it left is named. With Temporal unreachable nothing locked
    is skipped silently: it is listed unchecked and the exit code is 2."""
    conv, quiet = f"c-lost-{uuid.uuid4().hex[:6]}", f"c-quiet-{uuid.uuid4().hex[:6]}"
    wf = f"t-never-{uuid.uuid4().hex[:6]}"
    key = execution_id(wf, "call_3", "chain-x")
    with db.connect() as conn:
        for c in (conv, quiet):
            conn.execute("INSERT INTO conversation_lock (conversation_id, workflow_id, run_id, "
                         "acquired_at, execution_chain) VALUES (:c, :wf, 'run-x', 't', "
                         "'chain-x')", {"c": c, "wf": wf if c == conv else wf + "-q"})
        conn.execute("INSERT INTO tool_execution_log (execution_id, workflow_id, "
                     "conversation_id, user_id, tool_name, start_time, status) VALUES "
                     "(:k, :wf, :c, 'alice', 'slowWrite', 't', 'INITIATED')",
                     {"k": key, "wf": wf, "c": conv})
    monkeypatch.setenv("DATABASE_URL", db.url)
    capsys.readouterr()
    assert await starter.main(["check"], client=client) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        f"conversation {conv}: audit row {key} (slowWrite) was left open (INITIATED)",
        f"awaits repair: conversation {conv}: its lock holder, turn {wf}, is no longer running "
        f"(NOT_FOUND); calls without a result: none; audit rows left "
        f"INITIATED: {key} (slowWrite)",
        f"note: conversation {quiet}: its lock holder, turn {wf}-q, is no longer running "
        "(NOT_FOUND); nothing awaits repair (its next turn takes the lock over)",
        "1 disagreement(s)"]

    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:9")  # nothing listens there
    assert await starter.main(["check", "--conversation", quiet]) == 2
    [unchecked, count] = capsys.readouterr().out.splitlines()
    assert unchecked.startswith(f"unchecked: conversation {quiet}: held by turn {wf}-q; "
                                "Temporal could not say whether it runs (cannot reach Temporal")
    assert count == "0 disagreement(s)"
