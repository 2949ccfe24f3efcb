"""Approvals by signal and update (docs/design.md, "Approvals"; names from docs/contract.md)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError

from tests.support.services import make_service, side_effects
from tests.support.sql import fetchall
from tests.support.turns import running_worker, wait_pending
from tests.support.waiting import wait_until
from turnstile.engine.contract import (
    ApprovalDecision,
    ApproveSignal,
    CallStatus,
    RejectSignal,
    ReviewInput,
    TurnProgress,
    TurnStatus,
)
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.workflows.state import SA_PENDING, SA_STATUS


def db_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path}/t.db"



def decisions(db: Database, wf_id: str) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, "SELECT tool_call_id, approved, reviewer, note FROM "
                              "approval_decision WHERE workflow_id = :wf ORDER BY tool_call_id",
                              {"wf": wf_id})


PAY = tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com", "amount": 10}))


async def listed(client: Client, query: str) -> list[str]:
    """The ids a visibility query finds, once it finds any (visibility is
    eventually consistent)."""
    async def ids() -> list[str]:
        return [w.id async for w in client.list_workflows(query)]

    return await wait_until(ids, timeout=10, interval=0.1, what=query)


async def test_approve_runs_the_call_and_is_audited(client: Client, task_queue: str, tmp_path,
                                                    fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(PAY, text_reply("paid"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob")
        [pending] = await wait_pending(handle)
        assert pending.tool_name == "sendMoneySlowly"
        assert pending.arguments == {"to": "bob@example.com", "amount": 10}
        assert side_effects(turns.rt.db, handle.id) == []  # paused before executing
        await handle.signal("approve", ApproveSignal(tool_call_id="p1", reviewer="carol",
                                                     comment="ok"))
        result = await handle.result()
        assert result.status == TurnStatus.COMPLETED
        assert result.tool_calls[0].status == CallStatus.COMPLETED
        assert len(side_effects(turns.rt.db, handle.id)) == 1
        assert decisions(turns.rt.db, handle.id) == [
            {"tool_call_id": "p1", "approved": 1, "reviewer": "carol", "note": "ok"}]


async def test_reject_reaches_the_model_as_error(client: Client, task_queue: str, tmp_path,
                                                 fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(PAY, text_reply("not paid"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob")
        await wait_pending(handle)
        await handle.signal("reject", RejectSignal(tool_call_id="p1", reviewer="carol",
                                                   reason="amount looks wrong"))
        result = await handle.result()
        assert side_effects(turns.rt.db, handle.id) == []
        assert decisions(turns.rt.db, handle.id)[0]["approved"] == 0
    assert result.status == TurnStatus.COMPLETED
    assert result.tool_calls[0].status == CallStatus.REJECTED and result.tool_calls[0].is_error
    told = [m for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert "rejected by carol: amount looks wrong" in told


async def test_deadline_rejects(client: Client, task_queue: str, tmp_path,
                                fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("p1", "sendMoney", {"to": "bob", "amount": 1})),
                    text_reply("timed out"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("pay bob")  # nobody answers: the 2 s deadline passes
    assert result.tool_calls[0].status == CallStatus.REJECTED
    told = [m for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert "rejected by deadline: no decision within 2 s" in told


async def test_unknown_and_early_signals_are_refused(client: Client, task_queue: str, tmp_path,
                                                     fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(PAY, text_reply("paid"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob")
        # Early: the call id the model is about to use, before the turn asks for it.
        await handle.signal("approve", ApproveSignal(tool_call_id="p1", reviewer="eager"))
        await wait_pending(handle)
        await handle.signal("approve", ApproveSignal(tool_call_id="nope", reviewer="carol"))

        async def both_refused() -> TurnProgress | None:
            progress = await handle.query("status", result_type=TurnProgress)
            return progress if len(progress.refused_signals) >= 2 else None

        progress = await wait_until(both_refused, what="both signals refused")
        assert progress.step == "awaiting_approval"  # neither signal released the call
        assert len(progress.refused_signals) == 2
        assert "'eager'" in progress.refused_signals[0] and "'nope'" in progress.refused_signals[1]
        await handle.signal("approve", ApproveSignal(tool_call_id="p1", reviewer="carol"))
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED
    assert result.tool_calls[0].status == CallStatus.COMPLETED


async def test_two_approvals_in_one_round(client: Client, task_queue: str, tmp_path,
                                          fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("a", "sendMoneySlowly", {"to": "ann", "amount": 1}),
                               ("b", "sendMoneySlowly", {"to": "ben", "amount": 2})),
                    text_reply("done"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay both")
        pending = await wait_pending(handle, 2)
        assert sorted(p.tool_call_id for p in pending) == ["a", "b"]
        await handle.signal("reject", RejectSignal(tool_call_id="b", reviewer="carol"))
        await handle.signal("approve", ApproveSignal(tool_call_id="a", reviewer="carol"))
        result = await handle.result()
        effects = side_effects(turns.rt.db, handle.id)
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED, CallStatus.REJECTED]
    assert [e["note"] for e in effects] == ["ann:1"]


async def test_review_update_validates(client: Client, task_queue: str, tmp_path,
                                       fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(PAY, text_reply("paid"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob")
        await wait_pending(handle)
        with pytest.raises(WorkflowUpdateFailedError) as err:
            await handle.execute_update("review", ReviewInput(tool_call_id="zzz", reviewer="c",
                                                              approved=True))
        assert "no pending approval for tool call 'zzz'" in str(err.value.cause)
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("review", ReviewInput(tool_call_id="p1", reviewer=" ",
                                                              approved=True))
        taken = await handle.execute_update(
            "review", ReviewInput(tool_call_id="p1", reviewer="carol", approved=True,
                                  note="ok\x00"), result_type=ApprovalDecision)
        assert (taken.tool_call_id, taken.approved, taken.reviewer) == ("p1", True, "carol")
        assert taken.note == "ok\ufffd" and taken.decided_at  # a NUL never reaches a store
        result = await handle.result()
    assert result.tool_calls[0].status == CallStatus.COMPLETED


async def test_waiting_turns_are_findable(client: Client, task_queue: str, tmp_path,
                                          fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(PAY, text_reply("paid"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        assert turns.rt.search_attributes
        handle = await turns.start("pay bob", conversation="c-find")
        await wait_pending(handle)
        query = ('TurnstilePendingApprovals > 0 AND TurnstileConversation = "c-find" '
                 f'AND WorkflowId = "{handle.id}"')
        found = await listed(client, query)
        assert found == [handle.id]
        desc = await handle.describe()
        # Search attributes are set; the memo only stands in where they are not registered.
        assert desc.typed_search_attributes.get(SA_PENDING) == 1
        assert desc.typed_search_attributes.get(SA_STATUS) == "awaiting_approval"
        assert not desc.raw_description.workflow_execution_info.memo.fields
        await handle.signal("approve", ApproveSignal(tool_call_id="p1", reviewer="carol"))
        await handle.result()


async def test_a_decision_in_the_deadlines_activation_stands(
        client: Client, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    """The worker is away while the approval deadline passes; the approval is
    signalled before it comes back, so the timer and the decision arrive in one
    activation. The decision stands (the deadline used to overwrite it)."""
    fake_llm.script(tool_reply(("m1", "sendMoney", {"to": "bob@example.com", "amount": 5})),
                    text_reply("paid"))
    queue = f"deadline-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob")
        await wait_pending(handle)

    async def deadline_fired() -> bool:  # the 2 s deadline fires while no worker runs the turn
        history = await handle.fetch_history()
        return any(e.event_type == EventType.EVENT_TYPE_TIMER_FIRED for e in history.events)

    await wait_until(deadline_fired, what="the approval deadline fired")
    await handle.signal("approve", ApproveSignal(tool_call_id="m1", reviewer="carol"))
    async with running_worker(client, queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        result = await handle.result()
        assert result.tool_calls[0].status == CallStatus.COMPLETED, result.tool_calls
        assert len(side_effects(turns.rt.db, handle.id)) == 1
        assert decisions(turns.rt.db, handle.id) == [
            {"tool_call_id": "m1", "approved": 1, "reviewer": "carol", "note": ""}]


async def test_model_call_ids_never_name_a_refusal_row(client: Client, task_queue: str,
                                                       tmp_path,
                                                       fake_llm: FakeOpenAIServer) -> None:
    """The audit keys a refused decision "<call id>/refused-<n>": a model that
    names its call "p1/refused-1" gets an id of its own, and the refusal of
    p1 (by the requester herself) and that call each keep their row. A
    reviewer's call id with a NUL is refused and audited, never breaking the turn."""
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com", "amount": 1}),
                               ("p1/refused-1", "sendMoneySlowly",
                                {"to": "eve@example.com", "amount": 2})),
                    text_reply("paid"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob and eve", user="alice")
        pending = await wait_pending(handle, 2)
        ids = sorted(p.tool_call_id for p in pending)
        assert ids[0] == "p1" and "/" not in ids[1], ids
        await handle.signal("approve", ApproveSignal(tool_call_id="p1", reviewer="alice"))
        await handle.signal("approve", ApproveSignal(tool_call_id="p\x001", reviewer="carol"))
        for call in ids:
            await handle.signal("approve", ApproveSignal(tool_call_id=call, reviewer="carol"))
        result = await handle.result()
        with turns.rt.db.connect() as conn:
            rows = fetchall(conn, "SELECT execution_id, status FROM tool_execution_log "
                                  "WHERE workflow_id = :wf ORDER BY execution_id",
                                  {"wf": handle.id})
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 2
    assert sorted(r["status"] for r in rows) == [
        "APPROVAL_REFUSED", "APPROVAL_REFUSED", "COMPLETED", "COMPLETED"], rows
    assert not any("\x00" in r["execution_id"] for r in rows)


async def test_a_running_turn_is_found_by_conversation_user_and_service(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    """From revision 3 a turn publishes its search attributes once begin_turn
    returns: found while its first model call still runs, no approval needed."""
    answering = threading.Event()

    def slow(_request: dict) -> dict:  # type: ignore[type-arg]
        answering.wait(20)
        return text_reply("done")

    fake_llm.default = slow
    user, conversation = f"u-{uuid.uuid4().hex[:6]}", f"c-{uuid.uuid4().hex[:6]}"
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("hello", user=user, conversation=conversation)
        query = (f"TurnstileUser = '{user}' AND TurnstileConversation = '{conversation}' "
                 "AND TurnstileService = 'test' AND ExecutionStatus = 'Running'")
        found = await listed(client, query)
        answering.set()
        result = await handle.result()
    assert found == [handle.id]
    assert result.status == TurnStatus.COMPLETED
