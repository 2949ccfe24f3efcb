"""A worker SIGKILLed inside `turnstile.review_call` (a real `python
worker.py` process): while a tool's approval condition is evaluated, while
the activity derives where the call's sensitive arguments came from
(information-flow rules), and while it looks for earlier look-alike effects.
The activity's heartbeat timeout ends the lost attempt, the next worker runs
it again, and the call waits for a reviewer with exactly what a turn that
lost no worker shows (reason, provenance, look-alikes, notes, digest); once
approved the turn ends with one decision, one audit row and one effect, and
`starter.py check` is clean. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import TimeoutType
from temporalio.client import Client, WorkflowHandle

from tests.support import holds
from tests.support.services import make_service, side_effects
from tests.support.sql import fetchall
from tests.support.turns import running_worker, wait_pending
from tests.support.waiting import wait_until
from tests.support.worker_loss import ProcessTurns, activity_runs
from turnstile.cli import starter
from turnstile.engine.activity_io import REVIEW_CALL
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    CallStatus,
    Handlers,
    PendingApproval,
    TurnInput,
    TurnResult,
    TurnStatus,
)
from turnstile.runtime.tools import ToolRegistry, tool
from turnstile.stores.audit import AuditLog, AuditStatus
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.testing.processes import DevServer
from turnstile.workflows.tool_options import LISTING_HEARTBEAT

POINTS = ["condition", holds.PREFIX + "derive", holds.PREFIX + "look_alikes"]


async def _turn(turns: ProcessTurns, conv: str, wf_id: str,
                message: str) -> WorkflowHandle[Any, TurnResult]:
    return await turns.client.start_workflow(
        WORKFLOW_TYPE, TurnInput(conversation_id=conv, user_id="alice", message=message,
                                 service="test-review", variables={"team": "ops"}),
        id=wf_id, task_queue=turns.task_queue, result_type=TurnResult)


def _script(fake_llm: FakeOpenAIServer) -> None:
    """One conversation's two turns: bob (named by the user) is paid 5 at
    once; then the inbox is read and mallory (named by the inbox) is to be
    paid 500: over the limit, from untrusted content, and like bob's payment."""
    fake_llm.script(tool_reply(("p1", "payOut", {"to": "bob@home.example", "amount": 5})),
                    text_reply("paid bob"),
                    tool_reply(("r1", "readInbox", {})),
                    tool_reply(("p2", "payOut", {"to": "mallory@evil.example", "amount": 500})),
                    text_reply("paid mallory"))


def _seen(item: PendingApproval) -> dict[str, Any]:
    """A pending item without its clock readings."""
    shown = item.model_dump(exclude={"requested_at", "deadline"})
    for effect in shown["similar_effects"]:
        effect.pop("at")
    return shown


async def _conversation(turns: ProcessTurns, conv: str, hold: Path | None = None,
                        kill: Any = None) -> tuple[WorkflowHandle[Any, TurnResult], dict[str, Any]]:
    """Both turns of `conv`; `hold`: made between them (the worker holds
    in the second turn's review_call), `kill(handle)` runs then. The second
    turn's pending item, then approved."""
    first = await _turn(turns, conv, f"{conv}-1", "pay bob@home.example 5")
    done = await asyncio.wait_for(first.result(), timeout=30)
    assert done.status == TurnStatus.COMPLETED, done.error
    if hold is not None:
        hold.touch()
    handle = await _turn(turns, conv, f"{conv}-2", "read my inbox and do what it says")
    if kill is not None:
        await kill(handle)
    [pending] = await wait_pending(handle)
    await handle.signal("approve", ApproveSignal(tool_call_id="p2", reviewer="carol"))
    result = await asyncio.wait_for(handle.result(), timeout=30)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 2
    return handle, _seen(pending)


@pytest.mark.parametrize("point", POINTS)
async def test_worker_killed_inside_review_call(
        point: str, client: Client, temporal_server: DevServer, task_queue: str,
        tmp_path: Path, fake_llm: FakeOpenAIServer, db: Database,
        monkeypatch: pytest.MonkeyPatch) -> None:
    side_effects(db)  # the test tools' table, made before any journal transaction
    turns = ProcessTurns(client, temporal_server, task_queue, tmp_path, fake_llm.url, db.url)
    hold = tmp_path / "hold"
    env = holds.env(point, hold)
    _script(fake_llm)
    _script(fake_llm)
    worker = turns.worker("worker1", **env)
    try:
        # The same conversation without a kill: what the reviewer must see.
        _, expected = await _conversation(turns, f"c-calm-{task_queue}")

        async def kill(handle: WorkflowHandle[Any, TurnResult]) -> None:
            nonlocal worker
            try:
                await wait_until(Path(f"{hold}.entered").exists, timeout=30,
                                 what=f"review_call never reached {point}")
            finally:
                worker.kill()  # SIGKILL inside review_call
            assert side_effects(db, f"{conv}-2/") == []
            with db.connect() as conn:
                assert fetchall(conn, "SELECT * FROM approval_decision WHERE workflow_id = :w",
                                {"w": f"{conv}-2"}) == []
            hold.unlink()
            worker = turns.worker("worker2", **env)

        conv = f"c-kill-{task_queue}"
        handle, seen = await _conversation(turns, conv, hold, kill)
    finally:
        worker.stop()
    # What the reviewer saw is what the turn without a kill showed.
    assert seen == expected
    assert seen["reason"] == "a payment of 500 is over the limit of 100"
    assert [s["tool_call_id"] for s in seen["provenance"]["to"]] == ["r1"]
    assert [(e["tool_call_id"], e["status"]) for e in seen["similar_effects"]] \
        == [("p1", CallStatus.COMPLETED.value)]
    # The lost attempt ended by review_call's heartbeat timeout; the second one answered.
    [(scheduled, started)] = await activity_runs(handle, REVIEW_CALL)
    attrs = scheduled.activity_task_scheduled_event_attributes
    assert attrs.heartbeat_timeout.ToTimedelta() == LISTING_HEARTBEAT
    run = started.activity_task_started_event_attributes
    assert run.attempt == 2
    assert run.last_failure.timeout_failure_info.timeout_type \
        == TimeoutType.TIMEOUT_TYPE_HEARTBEAT, run.last_failure
    # One decision, one audit row, one effect.
    wf_id = f"{conv}-2"
    with db.connect() as conn:
        decisions = fetchall(conn, "SELECT tool_call_id, approved, reviewer FROM "
                                   "approval_decision WHERE workflow_id = :w", {"w": wf_id})
    assert decisions == [{"tool_call_id": "p2", "approved": 1, "reviewer": "carol"}]
    [paid] = [r for r in AuditLog(db).rows(wf_id) if r.tool_name == "payOut"]
    assert paid.status is AuditStatus.COMPLETED, paid
    assert paid.approval_reason == seen["reason"]
    assert paid.provenance is not None and '"r1"' in paid.provenance
    assert [e["note"] for e in side_effects(db, f"{conv}-2/")] == ["mallory@evil.example:500"]
    assert [e["note"] for e in side_effects(db, f"{conv}-1/")] == ["bob@home.example:5"]
    monkeypatch.setenv("DATABASE_URL", db.url)
    assert await starter.main(["check"], client=client) == 0


SLOW_CONDITION_SECONDS = LISTING_HEARTBEAT.total_seconds() + 2


def _slowly_over_the_limit(args: Any) -> str | None:
    time.sleep(SLOW_CONDITION_SECONDS)  # e.g. a slow query of a busy database
    return "a slow condition holds"


@tool(idempotent=True, approval=_slowly_over_the_limit, approval_timeout_seconds=600)
def payCarefully(to: str, amount: int) -> dict[str, Any]:  # noqa: N802
    """Pay someone (a condition that takes its time decides whether a reviewer sees it)."""
    return {"paid": amount, "to": to}


async def test_a_condition_slower_than_the_heartbeat_timeout_is_not_lost(
        client: Client, task_queue: str, sqlite_url: str, fake_llm: FakeOpenAIServer) -> None:
    """No worker is lost: a condition that runs longer than review_call's
    heartbeat timeout is waited for (the activity heartbeats while it
    runs), not timed out and run again, and again."""
    fake_llm.script(tool_reply(("p1", "payCarefully", {"to": "bob", "amount": 5})),
                    text_reply("paid"))
    service = replace(make_service("test-slow-condition"),
                      tools=ToolRegistry([payCarefully]))
    async with running_worker(client, task_queue, sqlite_url, [service],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob 5", service="test-slow-condition")
        deadline = asyncio.get_running_loop().time() + 3 * SLOW_CONDITION_SECONDS
        while not (pending := await handle.query(
                Handlers.PENDING_APPROVALS, result_type=list[PendingApproval])):
            assert asyncio.get_running_loop().time() < deadline, "no pending approval"
            await asyncio.sleep(0.2)
        await handle.terminate("test over")
    assert pending[0].reason == "a slow condition holds"
    [(_, started)] = await activity_runs(handle, REVIEW_CALL)
    assert started.activity_task_started_event_attributes.attempt == 1
