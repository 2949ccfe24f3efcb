"""The bytes a turn adds to its history do not grow with the conversation."""

from __future__ import annotations

from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.engine.contract import TurnStatus
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


def _prefill(db, conversation: str, n: int) -> None:  # type: ignore[no-untyped-def]
    """Rows as another program would insert them: only the four required columns."""
    with db.connect() as conn:
        conn.execute("INSERT INTO conversation (conversation_id, user_id, created_at) "
                     "VALUES (:c, 'alice', '2026-01-01')", {"c": conversation})
        conn.executemany(
            "INSERT INTO chat_message (conversation_id, seq, role, content)"
            " VALUES (:c, :seq, :role, :content)",
            [{"c": conversation, "seq": i, "role": "user" if i % 2 == 0 else "assistant",
              "content": f"message number {i:06d} " + "x" * 200} for i in range(n)])


def _payload_size(event) -> int:  # type: ignore[no-untyped-def]
    """Bytes of an event without the server's clock and task id: their varint
    length changes with the time of day (nanos below or above 2^28), by one
    byte on every event of a turn, which is noise, not growth."""
    copy = type(event)()
    copy.CopyFrom(event)
    copy.ClearField("event_time")
    copy.ClearField("task_id")
    return copy.ByteSize()


async def test_history_bytes_independent_of_conversation_length(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    sizes = {}
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        for n in (10, 1000):
            conv = f"long-{n}"
            _prefill(turns.rt.db, conv, n)
            fake_llm.script(tool_reply((f"call-{n}", "add", {"a": 1, "b": 2})), text_reply("3"))
            handle = await turns.start("1+2?", conversation=conv)
            result = await handle.result()
            assert result.status == TurnStatus.COMPLETED
            # The model really saw the conversation (all of it when short; the
            # newest messages, within the memory window, when long)...
            sent = fake_llm.requests[-1]["messages"]
            assert sent[-3]["content"] == "1+2?"  # then the assistant call and its result
            assert sent[-4]["content"].startswith(f"message number {n - 1:06d}")
            assert len(sent) == n + 4 if n == 10 else 20 < len(sent) < n
            history = await handle.fetch_history()
            sizes[n] = sum(_payload_size(e) for e in history.events)
    # ...but the history did not carry it: a few bytes (digits of counters and ids).
    assert abs(sizes[1000] - sizes[10]) < 64, sizes
