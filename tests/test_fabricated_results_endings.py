"""A turn stopped while it asks the model again after a made-up tool result
(revision 9; turnstile.engine.answer_rules.fabricated_result): cancelled,
terminated, or its worker SIGKILLed while the re-ask (no tools, the nudge)
is held open by the scripted model server. Whatever ends it, the made-up
answer and the nudge never reach a later turn of the conversation, memory
keeps every call paired with its result, the real call ran once, and the
truth check finds nothing. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError

from tests.support.services import make_service
from tests.support.sql import fetchall
from tests.support.turns import running_worker
from tests.support.waiting import wait_until
from tests.support.worker_loss import HangingReply, ProcessTurns, activity_runs
from tests.test_exit_paths import stored_pairing
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import CALL_MODEL
from turnstile.engine.answer_rules import FABRICATED_NUDGE
from turnstile.engine.contract import TurnStatus
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.stores.truth import disagreements
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MADE_UP = 'The sum is 4.\n<tool_response>{"sum": 4}</tool_response>'
MADE_UP_MAIL = '<tool_response>\n{"taskId": "T0001", "status": "QUEUED"}\n</tool_response>'


def never_shown(request: dict[str, Any]) -> bool:
    """Neither a made-up result nor the nudge is in a request."""
    text = str(request["messages"])
    return "<tool_response>" not in text and FABRICATED_NUDGE not in text


async def _held_in_the_re_ask(fake_llm: FakeOpenAIServer, hang: HangingReply) -> None:
    await wait_until(hang.entered.is_set, timeout=30, what="the re-ask without tools")
    first, again = fake_llm.requests[-2:]
    assert "tools" in first and "tools" not in again
    assert again["messages"][-1] == {"role": "user", "content": FABRICATED_NUDGE}


@pytest.mark.parametrize("ending", ["cancel", "terminate"])
async def test_a_turn_ended_during_the_re_ask_leaves_memory_whole_and_the_made_up_answer_out(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer,
        ending: str) -> None:
    conv = f"c-reask-{ending}-{uuid.uuid4().hex[:6]}"
    hang = HangingReply()
    fake_llm.script(tool_reply(("call_0", "add", {"a": 1, "b": 2})), text_reply(MADE_UP), hang,
                    text_reply("You asked about 1 + 2: it is 3."))
    try:
        async with running_worker(client, task_queue, db.url, [make_service()],
                                  llm_url=fake_llm.url) as turns:
            handle = await turns.start("add 1 and 2", conversation=conv)
            await _held_in_the_re_ask(fake_llm, hang)
            if ending == "cancel":
                await handle.cancel()
                with pytest.raises(WorkflowFailureError) as err:
                    await handle.result()
                assert isinstance(err.value.cause, CancelledError)
            else:
                await handle.terminate("operator gave up")
            nxt = await turns.run("what did you find?", conversation=conv)
            violations = stored_pairing(db, conv)
            stored = MemoryStore(db).messages(conv)
            truth = disagreements(db, conv)
            with db.connect() as conn:
                audit = fetchall(conn, "SELECT tool_name, status FROM tool_execution_log "
                                       "WHERE workflow_id = :w", {"w": handle.id})
    finally:
        hang.released.set()
    assert nxt.status == TurnStatus.COMPLETED, nxt.error
    assert nxt.answer == "You asked about 1 + 2: it is 3."
    assert violations == [] and truth == []
    assert audit == [{"tool_name": "add", "status": "COMPLETED"}]  # the real call, once
    assert never_shown(fake_llm.requests[-1])
    # The real call and its result stay; the made-up answer is never shown
    # again, and the nudge is never stored.
    assert [m.tool_call_id for m in stored if m.role == "tool"] == ["call_0"]
    assert all(m.content != FABRICATED_NUDGE for m in stored)
    kept = [m for m in stored if m.content == MADE_UP]
    assert all(m.attributes.get(attr.DISCARDED) == "fabricated_result" for m in kept)
    assert not fake_llm.refusals



async def test_a_worker_killed_during_the_re_ask_asks_once_more_the_same_and_nothing_runs(
        db_process_turns: ProcessTurns, fake_llm: FakeOpenAIServer) -> None:
    """`python worker.py` SIGKILLed while the re-ask is held open: another
    worker retries that same request (no tools, the nudge; not a third
    round, not a fresh first request) and the honest answer completes the
    turn; no mail was queued by the made-up one."""
    hang = HangingReply()
    fake_llm.script(text_reply(MADE_UP_MAIL), hang, text_reply("No e-mail was sent yet."))
    wf_id = f"reask-kill-{db_process_turns.task_queue}"
    first = db_process_turns.worker("worker1")
    try:
        handle = await db_process_turns.start(wf_id, "mail ops the numbers",
                                           service="sales-assistant")
        await _held_in_the_re_ask(fake_llm, hang)
    finally:
        first.kill()
    second = db_process_turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        hang.released.set()
        second.stop()
    assert result.status is TurnStatus.COMPLETED, result.error
    assert result.answer == "No e-mail was sent yet."
    assert result.tool_calls == []
    _, held, retried = fake_llm.requests
    assert retried["messages"] == held["messages"] and "tools" not in retried
    runs = await activity_runs(handle, CALL_MODEL)
    assert len(runs) == 2  # the first request and the re-ask: no third round
    assert runs[1][1].activity_task_started_event_attributes.attempt == 2  # the kill happened
    db = db_process_turns.db
    with db.connect() as conn:
        mails = fetchall(conn, "SELECT recipient FROM email_task")
    conv = f"c-{wf_id}"
    stored = MemoryStore(db).messages(conv)
    assert mails == [] and disagreements(db, conv) == []
    assert all(m.content != FABRICATED_NUDGE for m in stored)
    assert [m.content for m in stored if m.role == "assistant"
            and not m.attributes.get(attr.DISCARDED)] == ["No e-mail was sent yet."]
    assert not fake_llm.refusals
