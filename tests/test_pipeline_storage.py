"""What the pipeline stores, on both databases: message parts, discarded
answers, the augmented text of "original" retrieval memory, the stream buffer."""

from __future__ import annotations

import asyncio

import pytest

from turnstile.engine import attributes as attr
from turnstile.engine.messages import Attachment, ChatMessage
from turnstile.stores import streaming
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.stores.streaming import StreamWriter, read_stream

pytest_plugins = ["tests.support.databases"]


def test_parts_discard_and_augmented_text(db: Database) -> None:
    store = MemoryStore(db)
    with db.connect() as conn:
        store.bind(conn, "c", "alice")
    image = Attachment(type="image_base64", data="QUJD", mime_type="image/png")
    user = ChatMessage(role="user", content="see this", parts=[image],
                       attributes={attr.AUGMENTED_USER_MESSAGE: "see this\n\n[doc] text"})
    store.append("c", 0, [user, ChatMessage(role="assistant", content="draft")], "wf-1")
    store.append("c", 0, [user], "wf-1")  # a retried write is a no-op, parts included
    store.discard("c", 1, "output_guardrail:x")
    store.append("c", 2, [ChatMessage(role="assistant", content="final")], "wf-1")
    mine = store.messages("c", "wf-1")
    assert [(m.role, m.content) for m in mine] == [("user", "see this\n\n[doc] text"),
                                                  ("assistant", "final")]
    assert mine[0].parts == [image]
    later = store.messages("c", "wf-2")  # another turn reads the user's words
    assert later[0].content == "see this" and later[0].parts == [image]
    assert store.get("c", 1)[0].attributes[attr.DISCARDED] == "output_guardrail:x"  # type: ignore[index]


def test_stream_buffer_is_coalesced_and_bounded(db: Database,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "MAX_CHUNKS", 20)  # the real cap (1000) behaves the same

    async def write() -> None:
        w = StreamWriter(db, "wf-s", 3, 1)
        await w.open()
        for piece in ["Hel", "lo, ", "wor", "ld"]:
            await w.add(piece)
        await w.close()
        big = StreamWriter(db, "wf-s", 5, 1)
        for _ in range(streaming.MAX_CHUNKS + 50):
            await big.add("x" * 64)
        await big.close()

    asyncio.run(write())
    rows = read_stream(db, "wf-s")
    first = [r for r in rows if r.response_seq == 3]
    assert "".join(r.text for r in first) == "Hello, world" and first[-1].done == 1
    assert len(first) <= 2  # coalesced, not one row per delta
    capped = [r for r in rows if r.response_seq == 5]
    assert len(capped) == streaming.MAX_CHUNKS and capped[-1].text.endswith("…")
    assert capped[-1].done == 1
    assert read_stream(db, "wf-s", (3, 1, first[-1].chunk))[0].response_seq == 5
