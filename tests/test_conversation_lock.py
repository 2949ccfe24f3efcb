"""Turns of one conversation never interleave (docs/design.md, "Isolation")."""

from __future__ import annotations

import asyncio

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker, wait_pending
from tests.support.waiting import wait_until
from turnstile.engine.contract import TurnStatus
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


async def test_second_turn_waits_for_the_first(client: Client, task_queue: str, tmp_path,
                                               fake_llm: FakeOpenAIServer) -> None:
    # FIFO replies: if the second turn ran during the first one's tool call, it
    # would take the first turn's answer and the assertions below would fail.
    fake_llm.script(tool_reply(("k1", "slowUpsert", {"note": "one", "seconds": 2})),
                    text_reply("first done"), text_reply("second done"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        first = await turns.start("first", conversation="c-shared")
        # The first turn holds the conversation once it has asked the model.
        await wait_until(lambda: fake_llm.requests, what="the first turn's model call")
        second = await turns.start("second", conversation="c-shared")
        r1, r2 = await asyncio.gather(first.result(), second.result())
        stored = MemoryStore(turns.rt.db).messages("c-shared")
    assert (r1.status, r1.answer) == (TurnStatus.COMPLETED, "first done")
    assert (r2.status, r2.answer) == (TurnStatus.COMPLETED, "second done")
    assert [(m.role, m.content) for m in stored if m.role in ("user", "assistant")] == [
        ("user", "first"), ("assistant", None), ("assistant", "first done"),
        ("user", "second"), ("assistant", "second done")]
    # The second turn saw the whole first turn.
    assert [m["content"] for m in fake_llm.requests[2]["messages"] if m["role"] == "user"] == [
        "first", "second"]
    # It waited visibly: its load_memory ran more than one attempt (ConversationBusy).
    history = await second.fetch_history()
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert max(attempts) > 1


async def test_lock_of_a_terminated_turn_is_taken_over(client: Client, task_queue: str,
                                                       tmp_path,
                                                       fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob", "amount": 1})),
                    text_reply("after"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        stuck = await turns.start("pay", conversation="c-stuck")
        await wait_pending(stuck)
        await stuck.terminate("operator gave up")  # ends without releasing the lock
        result = await asyncio.wait_for(turns.run("next", conversation="c-stuck"), 30)
    assert result.status == TurnStatus.COMPLETED and result.answer == "after"
