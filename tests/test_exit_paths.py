"""Every tool call in memory has exactly one result, on every exit path:
cancel while a call waits for approval and another runs,
terminate, and `reset` to the first workflow task of a turn waiting for
approval (a reset later in a turn: tests/test_reset_runs.py). Each is
followed by a new turn on the same conversation, which the strict fake model
server (400 on an unanswered call or an orphan result) must accept, and
memory itself is checked, not only what is sent."""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import replace
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError

from tests.support.resets import lock_of, reset_to
from tests.support.services import (
    BOOKING_STARTED,
    POLICY_SNIPPET,
    held_retriever,
    make_service,
    side_effects,
)
from tests.support.turns import running_worker, wait_pending
from tests.test_execution_chain import _first_task_completed
from turnstile.engine import attributes as attr
from turnstile.engine.contract import ApproveSignal, CallStatus, TurnStatus
from turnstile.engine.messages import ChatMessage
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.ledger import LedgerStatus, ToolLedger
from turnstile.stores.memory import MemoryStore
from turnstile.stores.superseded import superseded_messages
from turnstile.stores.truth import disagreements
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.testing.openai_conformance import pairing_violations


def stored_pairing(db: Database, conversation: str) -> list[str]:
    """The conformance check run over stored memory itself."""
    return pairing_violations([as_wire(m) for m in MemoryStore(db).messages(conversation)])


def as_wire(m: ChatMessage) -> dict[str, Any]:
    return {"role": m.role, "tool_call_id": m.tool_call_id,
            "tool_calls": [{"id": c.id} for c in m.tool_calls]}


def result_of(db: Database, conversation: str, call_id: str) -> list[ChatMessage]:
    return [m for m in MemoryStore(db).messages(conversation)
            if m.role == "tool" and m.tool_call_id == call_id]



def db_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path}/t.db"


async def test_cancel_gives_running_and_waiting_calls_a_result(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    conv = f"c-cancel-{uuid.uuid4().hex[:6]}"
    fake_llm.script(
        tool_reply(("call_0", "reserve", {"item": "table"})),
        tool_reply(("call_1", "slowWrite", {"note": "n", "seconds": 30}),
                   ("call_2", "sendMoneySlowly", {"to": "bob", "amount": 5})),
        text_reply("nothing is booked"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("book, write and pay", conversation=conv)
        await wait_pending(handle)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as err:
            await handle.result()
        assert isinstance(err.value.cause, CancelledError)
        db = turns.rt.db
        violations = stored_pairing(db, conv)
        reserve, write, pay = (result_of(db, conv, c) for c in ("call_0", "call_1", "call_2"))
        nxt = await turns.run("what is booked?", conversation=conv)
        truth = disagreements(db, conv)
    assert violations == [] and truth == []
    assert len(reserve) == len(write) == len(pay) == 1
    assert reserve[0].attributes.get(attr.ROLLED_BACK)  # compensable and completed: undone
    assert write[0].is_error and "may or may not have taken effect" in (write[0].content or "")
    assert write[0].attributes[attr.OUTCOME] == CallStatus.INTERRUPTED
    assert pay[0].is_error and "Not run: the turn was cancelled" in (pay[0].content or "")
    assert nxt.status == TurnStatus.COMPLETED, nxt.error


async def test_terminate_leaves_a_hole_the_next_turn_repairs(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    conv = f"c-term-{uuid.uuid4().hex[:6]}"
    fake_llm.script(tool_reply(("call_0", "add", {"a": 1, "b": 2}),
                               ("call_1", "sendMoneySlowly", {"to": "bob", "amount": 5})),
                    text_reply("nothing was paid"))
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        stuck = await turns.start("add and pay", conversation=conv)
        await wait_pending(stuck)
        await stuck.terminate("operator gave up")  # no workflow code runs
        hole = stored_pairing(db, conv)
        nxt = await turns.start("did you pay?", conversation=conv)
        result = await nxt.result()
        violations = stored_pairing(db, conv)
        [pay] = result_of(db, conv, "call_1")
        audit = [r for r in AuditLog(db).rows(stuck.id) if r.tool_name == "sendMoneySlowly"]
        events = await nxt.query("status")
        truth = disagreements(db, conv)
    assert truth == []
    assert hole  # the terminated turn left call_1 without a result (v0.1's 400 forever)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert violations == []
    # It waited for an approval: no attempt had claimed it, so it did not run,
    # and the repair's claim keeps a late attempt from running it.
    assert pay.is_error and "did not run" in (pay.content or "")
    assert pay.attributes[attr.OUTCOME] == CallStatus.FAILED
    assert pay.attributes[attr.REPAIRED]["by"] == nxt.id
    assert ToolLedger(db).status(stuck.id, "call_1", stuck.first_execution_run_id or "") \
        is LedgerStatus.COMPLETED
    assert [(r.status, "repaired by " + nxt.id in (r.error_message or ""))
            for r in audit] == [("FAILED", True)]
    assert any(e["step"] == "memory_repaired" and "call_1" in e["detail"]
               for e in events["events"])


async def test_reset_to_the_first_task_of_a_turn_waiting_for_approval(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    """The reset run starts the turn over: the base run's messages are
    superseded (kept, marked, never sent), the reset run holds the lock while
    it waits for the same approval, and the payment happens once."""
    conv = f"c-reset-{uuid.uuid4().hex[:6]}"
    pay = ("call_0", "sendMoneySlowly", {"to": "bob", "amount": 5})
    fake_llm.script(tool_reply(pay),  # the base run asks, then waits for a reviewer
                    tool_reply(pay),  # the reset run's model asks the same
                    text_reply("bob is paid"), text_reply("yes, bob was paid 5"))
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        base = await turns.start("pay bob", conversation=conv)
        await wait_pending(base)
        first_run = base.first_execution_run_id or ""
        after = await reset_to(client, base.id, first_run,
                               await _first_task_completed(client, base.id, first_run))
        await wait_pending(after)
        held = lock_of(db, conv)
        await after.signal("approve", ApproveSignal(tool_call_id="call_0", reviewer="carol"))
        reset_result = await after.result()
        released = lock_of(db, conv)
        kept = superseded_messages(db, conv)
        nxt = await turns.run("did you pay?", conversation=conv)
        violations = stored_pairing(db, conv)
        truth = disagreements(db, conv)
        stored = MemoryStore(db).messages(conv)
    assert truth == [] and violations == []
    assert reset_result.status == TurnStatus.COMPLETED, reset_result.error
    assert nxt.status == TurnStatus.COMPLETED, nxt.error
    # The lock: held by the turn's chain, in the reset run's name, then released.
    assert held == {"workflow_id": base.id, "execution_chain": first_run,
                    "run_id": after.run_id}
    assert released is None
    # The model never read the base run's messages: the reset run's first
    # request is its own system and user message.
    first_of_reset = fake_llm.requests[1]["messages"]
    assert [(m["role"], m.get("content")) for m in first_of_reset] == [
        ("system", "You are a test assistant for qa."), ("user", "pay bob")]
    assert "_refused" not in str(fake_llm.requests)
    # Memory: the conversation once (one user message "pay bob", one result
    # of call_0: the payment), the base run's rows kept as superseded.
    assert [m.content for m in stored if m.role == "user"] == ["pay bob", "did you pay?"]
    [paid] = [m for m in stored if m.role == "tool"]
    assert not paid.is_error and "bob" in (paid.content or "")
    assert [(k.seq, k.message.role) for k in kept] == [
        (0, "system"), (1, "user"), (2, "assistant"), (2, "tool")]
    assert {(k.run_id, k.superseded_by) for k in kept[:3]} == {(first_run, after.run_id)}
    marker = kept[3].message.attributes[attr.SUPERSEDED_EFFECT]
    assert (marker["effect"], marker["by"]) == ("made_again", after.run_id)
    assert [e["note"] for e in side_effects(db, base.id)] == ["bob:5"]  # paid once


async def test_cancel_while_begin_turn_retrieves_leaves_the_conversation_usable(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel while `begin_turn` holds the lock and runs the retriever: the
    turn ends Canceled before it took note of the lock, so it stores nothing,
    and the next turn of the conversation takes the lock of the ended turn
    over and completes."""
    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv("TEST_RETRIEVER_HOLD", str(hold))
    fake_llm.script(text_reply("the second turn's answer"))
    service = replace(make_service("test-retrieval"), retriever=held_retriever)
    async with running_worker(client, task_queue, db_url(tmp_path), [service],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("first", service="test-retrieval", conversation="c-cb")
        for _ in range(300):
            if (tmp_path / "hold.entered").exists():
                break
            await asyncio.sleep(0.05)
        assert (tmp_path / "hold.entered").exists(), "the retriever never ran"
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        assert isinstance(failed.value.cause, CancelledError)
        assert lock_of(turns.rt.db, "c-cb") is not None  # taken by begin_turn, never released
        hold.unlink()
        again = await turns.run("second", service="test-retrieval", conversation="c-cb")
        stored = MemoryStore(turns.rt.db).messages("c-cb")
    assert again.status == TurnStatus.COMPLETED, again.error
    assert again.answer == "the second turn's answer"
    assert [m.role for m in stored] == ["system", "user", "assistant"]
    assert str(stored[1].content).startswith("second")
    assert POLICY_SNIPPET in str(stored[1].content)
    assert len([r for r in fake_llm.requests if "_refused" not in r]) == 1


async def test_cancel_during_a_model_call_ends_the_turn_cancelled(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    """A cancel while the model is answering ends the turn Canceled (not
    failed with the activity's cancellation), releases the conversation, and
    the next turn goes on from the stored user message."""
    entered, released = threading.Event(), threading.Event()

    def hang(_request: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        released.wait(60)
        return text_reply("too late")

    fake_llm.script(hang, text_reply("the second turn's answer"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        try:
            handle = await turns.start("first", conversation="c-cm")
            for _ in range(300):
                if entered.is_set():
                    break
                await asyncio.sleep(0.05)
            assert entered.is_set(), "the model request never arrived"
            await handle.cancel()
            with pytest.raises(WorkflowFailureError) as failed:
                await handle.result()
        finally:
            released.set()
        assert isinstance(failed.value.cause, CancelledError)
        assert lock_of(turns.rt.db, "c-cm") is None  # released on the cancel path
        again = await turns.run("second", conversation="c-cm")
        stored = MemoryStore(turns.rt.db).messages("c-cm")
    assert again.status == TurnStatus.COMPLETED, again.error
    assert [(m.role, m.content) for m in stored] == [
        ("system", "You are a test assistant for qa."), ("user", "first"),
        ("user", "second"), ("assistant", "the second turn's answer")]
    assert stored_pairing(turns.rt.db, "c-cm") == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_cancelled_thread_tool_is_undone_after_its_effect_lands(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    """A plain-function tool runs in a thread that no cancel stops: its effect
    lands after the turn was cancelled. The cancel path's undo waits for that
    attempt to end and record what it did, then undoes it — it used to undo
    at once, find nothing, and leave the effect that landed afterwards."""
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else db_url(tmp_path)
    conv = f"c-thread-{uuid.uuid4().hex[:6]}"
    fake_llm.script(tool_reply(("call_0", "slowBook", {"item": "room 7", "seconds": 2})),
                    text_reply("nothing is booked"))
    BOOKING_STARTED.clear()
    async with running_worker(client, task_queue, url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("book room 7", conversation=conv)
        assert await asyncio.to_thread(BOOKING_STARTED.wait, 30)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as err:
            await handle.result()
        assert isinstance(err.value.cause, CancelledError)
        db = turns.rt.db
        effects = side_effects(db, f"{handle.id}")
        [booked] = result_of(db, conv, "call_0")
        truth = disagreements(db, conv)
        nxt = await turns.run("what is booked?", conversation=conv)
    assert [e["note"] for e in effects] == ["CANCELLED"]  # landed, then undone
    assert booked.attributes.get(attr.ROLLED_BACK) and booked.is_error
    assert truth == []
    assert nxt.status == TurnStatus.COMPLETED, nxt.error
