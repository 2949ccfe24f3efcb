"""Compensations (docs/design.md, "Compensations"): reverse order, memory rewritten to the truth,
a failing undo as a visible state, and undo on `cancel`."""

from __future__ import annotations

import asyncio
import json

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError

from tests.support.services import make_service, side_effects
from tests.support.turns import running_worker
from turnstile.engine import attributes as attr
from turnstile.engine.contract import CallStatus, PendingApproval, TurnStatus
from turnstile.stores.audit import AuditLog
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


def db_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path}/t.db"


async def undo_order(handle) -> list[str]:  # type: ignore[no-untyped-def]
    history = await handle.fetch_history()
    return [json.loads(e.user_metadata.summary.data) for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name
            == "turnstile.compensate_tool"]


async def test_later_failure_rolls_back_in_reverse_and_rewrites_memory(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("r1", "reserve", {"item": "table"})),
                    tool_reply(("r2", "reserve", {"item": "chairs"})),
                    tool_reply(("m1", "mustSucceed", {})))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("book", conversation="c-saga")
        result = await handle.result()
        db = turns.rt.db
        audit = {r.tool_name + r.execution_id[-2:]: r.status
                 for r in AuditLog(db).rows(handle.id)}
        memory = MemoryStore(db).messages("c-saga")
        # The next turn's model request carries the rewritten results.
        fake_llm.script(text_reply("nothing is booked"))
        await turns.run("what is booked?", conversation="c-saga")
    assert result.status == TurnStatus.ROLLED_BACK
    assert result.error is not None and result.error.type == "FatalToolFailure"
    assert [(c.id, c.status, c.rolled_back) for c in result.tool_calls] == [
        ("r1", CallStatus.ROLLED_BACK, True), ("r2", CallStatus.ROLLED_BACK, True),
        ("m1", CallStatus.FAILED, False)]
    # Reverse order of completion: chairs (r2) undone before table (r1).
    assert await undo_order(handle) == ["undo reserve r2", "undo reserve r1"]
    effects = side_effects(db, handle.id)
    assert {e["note"] for e in effects} == {"CANCELLED"} and len(effects) == 2
    assert audit == {"reserver1": "ROLLED_BACK", "reserver2": "ROLLED_BACK",
                     "mustSucceedm1": "FAILED"}
    tool_msgs = {m.tool_call_id: m for m in memory if m.role == "tool"}
    for cid in ("r1", "r2"):
        m = tool_msgs[cid]
        assert m.is_error and m.attributes[attr.ROLLED_BACK] is True
        assert m.attributes[attr.ROLLBACK_CAUSE]["call_id"] == "m1"
        assert m.content.startswith("ROLLED BACK")
    seen = {m.get("tool_call_id"): m["content"] for m in fake_llm.requests[-1]["messages"]
            if m["role"] == "tool"}
    assert seen["r1"].startswith("ROLLED BACK") and seen["r2"].startswith("ROLLED BACK")


async def test_compensation_that_keeps_failing_is_a_state(client: Client, task_queue: str,
                                                          tmp_path,
                                                          fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("s1", "stickyReserve", {"item": "room"})),
                    tool_reply(("m1", "mustSucceed", {})))
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [make_service(compensation_attempts=2)],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("book", conversation="c-sticky")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
        memory = MemoryStore(turns.rt.db).messages("c-sticky")
    assert result.status == TurnStatus.COMPENSATION_FAILED
    assert result.error is not None and "stickyReserve (s1)" in result.error.message
    assert [r.status for r in audit if r.tool_name == "stickyReserve"] == [
        "COMPENSATION_FAILED"]
    told = next(m for m in memory if m.tool_call_id == "s1")
    assert "MAY STILL EXIST" in (told.content or "") and told.attributes[attr.EFFECT_MAY_REMAIN]


async def test_cancel_runs_compensations_then_ends_cancelled(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("r1", "reserve", {"item": "table"})),
                    tool_reply(("p1", "sendMoneySlowly", {"to": "bob", "amount": 5})))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("book and pay")
        for _ in range(100):  # wait until the turn waits for the approval
            if await handle.query("pending_approvals", result_type=list[PendingApproval]):
                break
            await asyncio.sleep(0.1)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as err:
            await handle.result()
        assert isinstance(err.value.cause, CancelledError)
        effects = side_effects(turns.rt.db, handle.id)
        audit = AuditLog(turns.rt.db).rows(handle.id)
    assert [e["note"] for e in effects] == ["CANCELLED"]  # reserved, then undone; never paid
    # The payment waiting for approval was never run: recorded as such.
    assert [(r.tool_name, r.status) for r in audit] == [
        ("reserve", "ROLLED_BACK"), ("sendMoneySlowly", "FAILED")]
    assert "cancelled before" in (audit[1].error_message or "")
