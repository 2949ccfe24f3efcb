"""Per-turn reads are O(window), not O(conversation) (turnstile.stores.memory.tail,
the repair's watermark `conversation.answered_through`, indexed state reads).

1. The tail read gives the model exactly the window the whole conversation
   would give, for random conversations and windows (pure, on SQLite).
2. A real turn on a conversation of 10,000 prior messages reads a bounded
   number of rows, on both databases: the first turn after the messages were
   written reads them once to set the watermark; the next reads O(window).
"""

from __future__ import annotations

import random
import uuid

from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker
from tests.test_long_conversations import _history
from turnstile.engine import attributes as attr
from turnstile.engine.contract import TurnStatus
from turnstile.engine.memory_window import MemoryWindow, apply_window, paired
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.providers.tokens import estimate_tokens
from turnstile.stores.connection import rows_read
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply


def _count(text: str) -> int:
    return estimate_tokens(text)


def _random_conversation(rng: random.Random, n: int) -> list[ChatMessage]:
    out: list[ChatMessage] = [ChatMessage(role="system", content="be brief")]
    i = 0
    while len(out) < n:
        i += 1
        kind = rng.random()
        if kind < 0.05:
            out.append(ChatMessage(role="system", content=f"system v{i}"))
        elif kind < 0.25:
            calls = [ToolCall(id=f"c{i}_{k}", name="add", arguments='{"a": 1}')
                     for k in range(rng.randint(1, 3))]
            out.append(ChatMessage(role="assistant", tool_calls=calls))
            for c in calls:
                if rng.random() < 0.9:  # a few calls left without a result
                    out.append(ChatMessage(role="tool", tool_call_id=c.id,
                                           content="r" * rng.randint(1, 400)))
        elif kind < 0.3:
            out.append(ChatMessage(role="assistant", content="withdrawn",
                                   attributes={attr.DISCARDED: "guardrail"}))
        else:
            role = "user" if kind < 0.65 else "assistant"
            out.append(ChatMessage(role=role, content=f"m{i} " + "w " * rng.randint(1, 300)))
    return out


def test_the_tail_gives_the_same_window_as_the_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = Database(f"sqlite:///{tmp_path}/t.db")
    from turnstile.stores.schema import ensure_schema
    ensure_schema(db)
    memory = MemoryStore(db)
    rng = random.Random(7)
    for case in range(40):
        conv = f"c{case}"
        memory.check_owner(conv, "u")
        memory.append(conv, 0, _random_conversation(rng, rng.randint(1, 900)), "seed")
        window = rng.choice([MemoryWindow(max_messages=rng.randint(1, 80)),
                             MemoryWindow(max_tokens=rng.randint(50, 20_000)),
                             MemoryWindow(max_messages=rng.randint(1, 300),
                                          max_tokens=rng.randint(50, 5_000))])

        def cut(stored: list[ChatMessage]) -> list[ChatMessage]:
            return apply_window(paired(stored), window, _count).messages  # noqa: B023

        def full(stored: list[ChatMessage]) -> bool:
            return apply_window(paired(stored), window, _count).dropped > 0  # noqa: B023

        whole = memory.messages(conv)
        tail = memory.tail(conv, None, full, first_page=rng.choice([1, 4, 64]))
        assert cut(tail) == cut(whole), (case, window)
        assert len(tail) <= len(whole)


async def test_a_turn_on_ten_thousand_messages_reads_a_window(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = lambda _req: text_reply("still here")
    long, short = f"long-{uuid.uuid4().hex[:6]}", f"short-{uuid.uuid4().hex[:6]}"
    read: dict[str, list[int]] = {long: [], short: []}
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        memory = turns.rt.memory
        for conv, n in ((long, 10_000), (short, 10)):
            memory.check_owner(conv, "alice")
            memory.append(conv, 0, _history(n), "seed")
            for _ in range(3):
                before = rows_read.total
                result = await turns.run("and now?", conversation=conv)
                read[conv].append(rows_read.total - before)
                assert result.status == TurnStatus.COMPLETED, result.error
    # The first turn reads the conversation once (it predates the watermark).
    assert read[long][0] > 10_000
    # Then: bounded by the window (8,192 tokens: some hundreds of messages),
    # the same for 10,000 prior messages as for 10 plus that window.
    assert max(read[long][1:]) < 1_500, read
    assert max(read[long][1:]) < max(read[short][1:]) + 1_000, read
    print(f"rows read per turn ({db.dialect}): {read}")
