"""Keys that cannot collide: providers number tool calls by position
(`call_0`, `call_1`), so the same ids come back in every turn and in every run
of one workflow id. Every effect of a call is keyed by its turn's execution
chain (Temporal's first_execution_run_id), and a rollback touches only the
turn that made the call. On SQLite and PostgreSQL, through the real server."""

from __future__ import annotations

import uuid

from temporalio.client import Client, WorkflowHandle

from tests.support.services import make_service, side_effects
from tests.support.sql import fetchall
from tests.support.turns import running_worker, wait_pending
from turnstile.engine import attributes as attr
from turnstile.engine.contract import ApproveSignal, TurnStatus
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


async def approve(handle: WorkflowHandle, reviewer: str) -> str:
    [first, *_] = await wait_pending(handle)
    await handle.signal("approve", ApproveSignal(tool_call_id=first.tool_call_id,
                                                 reviewer=reviewer))
    return first.tool_call_id


def approvals(db: Database, wf_id: str) -> list[dict]:  # type: ignore[type-arg]
    with db.connect() as conn:
        return fetchall(conn, "SELECT * FROM approval_decision WHERE workflow_id = :wf "
                              "ORDER BY decided_at", {"wf": wf_id})


async def test_a_new_run_of_a_workflow_id_has_its_own_effects_and_rollback(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    wf_id, conv = f"turn-{uuid.uuid4().hex[:8]}", f"c-keys-{uuid.uuid4().hex[:6]}"
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        # Turn 1: reserve, an approved payment, an answer.
        fake_llm.script(tool_reply(("call_0", "reserve", {"item": "table"})),
                        tool_reply(("call_1", "sendMoneySlowly", {"to": "bob", "amount": 5})),
                        text_reply("booked and paid"))
        first = await turns.start("book and pay", conversation=conv, workflow_id=wf_id)
        assert await approve(first, "carol") == "call_1"
        one = await first.result()
        # Turn 2: a new run of the closed workflow id, the same call ids, the
        # same conversation; a fatal failure rolls it back.
        fake_llm.script(tool_reply(("call_0", "reserve", {"item": "chairs"})),
                        tool_reply(("call_1", "sendMoneySlowly", {"to": "dan", "amount": 7})),
                        tool_reply(("call_2", "mustSucceed", {})))
        second = await turns.start("book and pay again", conversation=conv, workflow_id=wf_id)
        assert await approve(second, "erin") == "call_1"
        two = await second.result()
        # The conversation goes on: the model accepts the stored history.
        fake_llm.script(text_reply("what is booked: the table"))
        three = await turns.run("what is booked?", conversation=conv)
        audit = AuditLog(db).rows(wf_id)
        memory = MemoryStore(db).messages(conv)
    assert second.result_run_id != first.result_run_id
    assert one.status == TurnStatus.COMPLETED, one.error
    assert two.status == TurnStatus.ROLLED_BACK, two.error
    assert three.status == TurnStatus.COMPLETED, three.error

    # Effects: turn 2 reserved and paid itself (not turn 1's stored results),
    # and its rollback cancelled only its own reservation.
    effects = sorted((e["tool"], e["note"]) for e in side_effects(db, wf_id))
    assert effects == [("reserve", "CANCELLED"), ("reserve", "table"),
                       ("sendMoney", "bob:5"), ("sendMoney", "dan:7")]
    keys = {e["call_key"] for e in side_effects(db, wf_id)}
    assert len(keys) == 4 and all(k.startswith(f"{wf_id}/") for k in keys)

    # One approval row per run, each naming its own reviewer.
    rows = approvals(db, wf_id)
    assert [(r["tool_call_id"], r["reviewer"]) for r in rows] == [
        ("call_1", "carol"), ("call_1", "erin")]
    assert len({r["execution_chain"] for r in rows}) == 2

    # Audit: one row per execution, turn 1's reservation still COMPLETED.
    by_call = sorted((r.tool_name, r.status) for r in audit)
    assert by_call == [("mustSucceed", "FAILED"), ("reserve", "COMPLETED"),
                       ("reserve", "ROLLED_BACK"), ("sendMoneySlowly", "COMPLETED"),
                       ("sendMoneySlowly", "COMPLETED")]
    assert len({r.execution_id for r in audit}) == 5

    # Memory: turn 1's result of call_0 is untouched; turn 2's says rolled back.
    results = [m for m in memory if m.role == "tool" and m.tool_call_id == "call_0"]
    assert len(results) == 2
    assert not results[0].is_error and "table" in (results[0].content or "")
    assert not results[0].attributes.get(attr.ROLLED_BACK)
    assert results[1].is_error and results[1].attributes.get(attr.ROLLED_BACK)
    assert "ROLLED BACK" in (results[1].content or "")
