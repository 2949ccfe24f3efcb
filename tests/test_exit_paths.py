"""Every tool call in memory has exactly one result, on every exit path
(issue 12): cancel while a call waits for approval and another runs,
terminate, and `reset` to the first workflow task of a turn waiting for
approval. Each is followed by a new turn on the same conversation, which the
strict fake model server (400 on an unanswered call or an orphan result)
must accept, and memory itself is checked, not only what is sent."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError

from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
from tests.support.openai_conformance import pairing_violations
from tests.support.services import make_service
from tests.support.turns import running_worker, wait_pending
from tests.test_execution_chain import _first_task_completed
from turnstile.engine import attributes as attr
from turnstile.engine.contract import CallStatus, TurnResult, TurnStatus
from turnstile.engine.messages import ChatMessage
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.stores.truth import disagreements


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
        client: Client, task_queue: str, tmp_path, fake_llm: FakeLLM) -> None:
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
        client: Client, task_queue: str, db: Database, fake_llm: FakeLLM) -> None:
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
        audit = [r for r in AuditLog(db).rows(stuck.id) if r["tool_name"] == "sendMoneySlowly"]
        events = await nxt.query("status")
        truth = disagreements(db, conv)
    assert truth == []
    assert hole  # the terminated turn left call_1 without a result (v0.1's 400 forever)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert violations == []
    assert pay.is_error and "may or may not have taken effect" in (pay.content or "")
    assert pay.attributes[attr.REPAIRED]["by"] == nxt.id
    assert [(r["status"], "repaired by " + nxt.id in (r["error_message"] or ""))
            for r in audit] == [("FAILED", True)]
    assert any(e["step"] == "memory_repaired" and "call_1" in e["detail"]
               for e in events["events"])


async def test_reset_to_the_first_task_of_a_turn_waiting_for_approval(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeLLM) -> None:
    conv = f"c-reset-{uuid.uuid4().hex[:6]}"
    fake_llm.script(tool_reply(("call_0", "sendMoneySlowly", {"to": "bob", "amount": 5})),
                    text_reply("I will not pay without an approval"),
                    text_reply("nothing was paid"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        base = await turns.start("pay bob", conversation=conv)
        await wait_pending(base)
        first_run = base.first_execution_run_id or ""
        point = await _first_task_completed(client, base.id, first_run)
        reset = await client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=base.id, run_id=first_run),
                reason="test: reset to the first workflow task",
                workflow_task_finish_event_id=point, request_id=str(uuid.uuid4())))
        after = client.get_workflow_handle(base.id, run_id=reset.run_id, result_type=TurnResult)
        reset_result = await after.result()
        db = turns.rt.db
        [pay] = result_of(db, conv, "call_0")
        nxt = await turns.run("did you pay?", conversation=conv)
        violations = stored_pairing(db, conv)
        truth = disagreements(db, conv)
    assert truth == []
    assert reset_result.status == TurnStatus.COMPLETED, reset_result.error
    assert pay.is_error and pay.attributes[attr.REPAIRED]["by"] == base.id
    assert nxt.status == TurnStatus.COMPLETED, nxt.error
    assert violations == []
