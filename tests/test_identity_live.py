"""One person however the name is spelled, cased or scripted
(docs/identity.md), through a real dev server, worker and database (SQLite
and PostgreSQL): `аlice` (Cyrillic а) cannot approve alice's e-mail, nor
`ТОМ` (Cyrillic capitals) tom's, through any door, each try audited; a turn
begun before revision 4 takes today's rule for its new decisions (a patch);
`Alice`, `alice`, `аlice` spend one daily token budget, and `ТОМ` spends
tom's; the usage rows keep their spellings and are keyed by the person
(migrations 0009 and 0011), and rows written before them still count."""

from __future__ import annotations

import asyncio
import json
import subprocess
import tarfile
import uuid
from collections.abc import Callable
from datetime import datetime
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support.databases import BACKENDS, migrate, sqlite_file_url
from tests.support.services import make_service
from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import Turns, running_worker, wait_pending
from tests.support.worker_env import WORKER_ENV
from tests.support.worker_process import ROOT, WorkerProcess
from tests.test_decision_doors import audited, run, turns_client
from turnstile.activities import Runtime, all_activities
from turnstile.cli.starter import review as cli_review
from turnstile.cli.worker import build_worker
from turnstile.client import ApprovalRefused
from turnstile.engine import activity_io as io
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    RejectSignal,
    ReviewInput,
    TurnInput,
    TurnResult,
    TurnStatus,
)
from turnstile.engine.errors import BudgetExceeded
from turnstile.engine.identity import person_keys
from turnstile.engine.versions import (
    NAMES_AS_IDENTITIES,
    NAMES_BY_STANDARD,
    NAMES_BY_TODAYS_RULE,
    NAMES_CASE_BLIND,
)
from turnstile.runtime.config import Settings
from turnstile.runtime.devstack import temporal_binary
from turnstile.runtime.services import ServiceRegistry
from turnstile.sales.service import build_sales_service
from turnstile.stores import usage
from turnstile.stores.db import Database
from turnstile.stores.schema import upgrade
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.workflows import AgentTurn

CYRILLIC_ALICE = "\u0430lice"
CYRILLIC_TOM = "\u0422\u041e\u041c"  # ТОМ
MAIL = {"to": "ops@example.com", "subject": "Renewal", "body": "Please renew."}
NAME_PATCHES = (NAMES_AS_IDENTITIES, NAMES_BY_STANDARD, NAMES_CASE_BLIND)


def name_markers(history: Any) -> list[str]:
    """The name rules' patches a turn's history asked."""
    markers = [str(e.marker_recorded_event_attributes) for e in history.events
               if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    return [p for p in NAME_PATCHES if any(p in m for m in markers)]


async def replays(history: Any) -> bool:
    replayer = Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter)
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return replayed.replay_failure is None


@pytest.mark.live
async def test_a_look_alike_of_the_requester_cannot_approve_her_email(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
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
    # Begun at revision 4, the turn decides by today's rule alone: it asks
    # no patch of the name rules (v0.3's allowed `аlice`), and replays.
    assert name_markers(history) == []
    assert await replays(history)
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
@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
async def test_TOM_cannot_decide_toms_call_through_any_door(
        client: Client, temporal_server: DevServer, task_queue: str, db: Database,
        fake_llm: FakeOpenAIServer) -> None:
    """`ТОМ` (Cyrillic capitals) looks like TOM, which is tom: refused at the
    Temporal CLI's signal, the SDK's signals, the update, the client and the
    CLI's review, each try audited; bob then decides."""
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", user="tom")
        await wait_pending(handle)
        code, said = await run(temporal_binary(), "workflow", "signal", "--workflow-id",
                               handle.id, "--name", "approve", "--input",
                               json.dumps({"tool_call_id": "e1", "reviewer": CYRILLIC_TOM}),
                               "--address", temporal_server.address)
        assert code == 0, said
        await handle.signal("reject", RejectSignal(tool_call_id="e1", reviewer="\u0422OM"))
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("review", ReviewInput(
                tool_call_id="e1", reviewer="\u0422\u03bf\u041c", approved=True))  # Т, ο, М
        tc = turns_client(client, task_queue)
        with pytest.raises(ApprovalRefused) as refused:
            await tc.review(handle.id, "e1", True, CYRILLIC_TOM, "mine")
        assert "is confusable with the requester 'tom'" in refused.value.reason
        assert await cli_review(tc, handle.id, True, "e1", "\u0442\u043e\u043c", "") == 1
        tries = await audited(db, handle, 5)
        assert len(await wait_pending(handle)) == 1  # still waiting
        await tc.review(handle.id, "e1", True, "bob", "fine")
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [json.loads(r["input_params"])["door"] for r in tries] == [
        "signal approve", "signal reject", "update review", "update review", "update review"]
    assert all("is confusable with the requester 'tom'" in r["error_message"] for r in tries)
    with db.connect() as conn:
        assert fetchall(conn, "SELECT reviewer FROM approval_decision") == [{"reviewer": "bob"}]
    assert name_markers(history) == [] and await replays(history)


def _activities_at_revision(rt: Runtime, revision: int) -> list[Callable[..., Any]]:
    """The worker's activities, with begin_turn recording `revision` (as a
    worker of that revision does)."""
    registered = all_activities(rt)
    real = next(fn for fn in registered if fn.__name__ == "begin_turn")

    @activity.defn(name=io.BEGIN_TURN)
    async def begin_turn(req: io.BeginTurnInput) -> io.BeginTurnResult:
        result: io.BeginTurnResult = await real(req)
        return result.model_copy(update={"revision": revision})

    return [fn for fn in registered if fn is not real] + [begin_turn]


@pytest.mark.live
async def test_a_turn_begun_before_revision_4_takes_todays_rule_for_what_it_decides_now(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """A turn in flight at the upgrade: its new decisions are taken by
    today's rule where the earlier one disagrees (the `names-case-blind`
    patch), so `ТОМ` is refused there too; the history replays."""
    rt = Runtime.build(Settings.from_env({
        **WORKER_ENV, "TURNSTILE_TASK_QUEUE": task_queue, "LLM_BASE_URL": fake_llm.url,
        "DATABASE_URL": sqlite_file_url(tmp_path / "t.db")}),
        ServiceRegistry([build_sales_service()]))
    migrate(rt.db)
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    revision = NAMES_BY_TODAYS_RULE - 1
    async with build_worker(client, rt, activities=_activities_at_revision(rt, revision),
                            max_cached_workflows=0):  # every task replays the turn
        handle = await Turns(client, rt).start("mail ops", service="sales-assistant",
                                               user="tom")
        await wait_pending(handle)
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer=CYRILLIC_TOM))
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="bob"))
        result = await handle.result()
        history = await handle.fetch_history()
    await rt.provider.aclose()
    assert result.status == TurnStatus.COMPLETED, result.error
    with rt.db.connect() as conn:
        assert fetchall(conn, "SELECT reviewer FROM approval_decision") == [{"reviewer": "bob"}]
    assert name_markers(history) == [NAMES_CASE_BLIND]
    assert await replays(history)


# The last commit whose worker began turns before revision 4 (the base of the
# identity work): its workflow code decided by the lower-cased rule.
BEFORE_REVISION_4 = "3f2606016acc777626a3297322f002edb935ee70"


def checkout_of(commit: str, dest: Path) -> Path:
    """`commit`'s files under `dest` (`git archive`, as tests/test_previous_release.py)."""
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.mark.live
async def test_a_decision_the_earlier_rule_took_replays_as_taken(
        client: Client, temporal_server: DevServer, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    """A turn whose worker, before revision 4, let `ТОМ` approve tom's call
    (the earlier rule did): today's workflow code replays its history with
    that approval, taking none of the names' patches."""
    old = checkout_of(BEFORE_REVISION_4, tmp_path / "before")
    queue = f"before-{uuid.uuid4().hex[:8]}"
    url = sqlite_file_url(tmp_path / "t.db")
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": queue,
           "DATABASE_URL": url, "LLM_BASE_URL": fake_llm.url,
           "TURNSTILE_DATA_DIR": str(tmp_path / "data")}
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("queued"))
    worker = WorkerProcess(tmp_path / "before.log", env, root=old).start()
    try:
        handle = await client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id=f"c-{queue}", user_id="tom",
                                     message="mail ops", service="sales-assistant"),
            id=f"turn-{queue}", task_queue=queue, result_type=TurnResult)
        await wait_pending(handle)
        await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer=CYRILLIC_TOM))
        result = await asyncio.wait_for(handle.result(), 60)
        history = await handle.fetch_history()
    finally:
        worker.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    with Database(url).connect() as conn:
        assert fetchall(conn, "SELECT reviewer FROM approval_decision") == [
            {"reviewer": CYRILLIC_TOM}]  # what the earlier rule let through
    assert name_markers(history) == []
    assert await replays(history)


@pytest.mark.live
async def test_every_spelling_of_a_user_spends_one_budget(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = text_reply("fine")  # 10 + 5 tokens each
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url,
                              env={"TURNSTILE_DAILY_TOKEN_BUDGET": "30"}) as turns:
        first = await turns.run("one", conversation=f"c1-{task_queue}", user="Alice")
        second = await turns.run("two", conversation=f"c2-{task_queue}", user="alice")
        third = await turns.run("three", conversation=f"c3-{task_queue}",
                                user=CYRILLIC_ALICE)
        other = await turns.run("four", conversation=f"c4-{task_queue}", user="bob")
        tom = await turns.run("five", conversation=f"c5-{task_queue}", user="tom")
        tom_again = await turns.run("six", conversation=f"c6-{task_queue}", user="Tom")
        capitals = await turns.run("seven", conversation=f"c7-{task_queue}",
                                   user=CYRILLIC_TOM)
    assert [first.status, second.status, other.status] == [TurnStatus.COMPLETED] * 3
    assert [tom.status, tom_again.status] == [TurnStatus.COMPLETED] * 2
    assert capitals.status == TurnStatus.REFUSED, capitals  # tom's 30 tokens are spent
    assert third.status == TurnStatus.REFUSED
    assert third.error is not None and third.error.type == BudgetExceeded.error_type
    assert "used 30 of 30 tokens" in third.error.message
    with db.connect() as conn:
        rows = fetchall(conn, sa.select(usage.model_usage.c.user_id, usage.model_usage.c.person)
                        .order_by(usage.model_usage.c.recorded_at))
    assert [(r["user_id"], r["person"]) for r in rows] == [
        ("Alice", "alice"), ("alice", "alice"), ("bob", "bob"), ("tom", "torn"),
        ("Tom", "torn")]  # (m looks like rn: UTS #39)


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
        # a worker of before migration 0011: `person` by its rule, no other key
        conn.sa.execute(sa.text(
            "INSERT INTO model_usage (usage_key, workflow_id, run_id, call_seq,"
            " conversation_id, user_id, service, model, prompt_tokens, completion_tokens,"
            " recorded_at, person) VALUES ('w/r/10', 'w', 'r', 10, 'c', :u, 's', 'm', 10, 5,"
            " :at, :p)"), {"u": "\u0410LICE", "at": day, "p": "\u0430lice"})
        assert usage.tokens_since(conn, "alice", since) == 60
        assert usage.tokens_since(conn, "\uff41lice", since) == 60
        assert usage.tokens_since(conn, "bob", since) == 15
        assert usage.tokens_since(conn, "carol", since) == 0
        keys = fetchall(conn, "SELECT user_id, person, person_upper, person_written"
                              " FROM model_usage ORDER BY call_seq")
        assert [tuple(r.values())[1:] for r in keys[:3]] == [
            tuple(person_keys(r["user_id"])) for r in keys[:3]]  # 0011 keyed them
        assert keys[2]["person_upper"] == "BOB" and keys[1]["person_written"] == "alice"
        assert [r["person_written"] for r in keys[3:]] == [None, None]
