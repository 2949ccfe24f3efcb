"""Property: a damaged row is named, not retried, and does not brick its
conversation (issue 48; turnstile.stores.damage).

Each example is a conversation with one real turn behind it (a tool call, its
result, an answer). Hypothesis writes damage into one column of one of its
rows — every column the product reads back from `chat_message` — as another
program or a broken copy could: bytes that are not UTF-8 (SQLite; PostgreSQL
refuses them on write), JSON of wrong shapes, wrong roles, values of the wrong
type, NUL (raw on SQLite, escaped in JSON on both), huge values. Then:

- the next turn ends within 5 s: with `DamagedRow` naming the conversation and
  the row's seq when the row is damaged by the rule, else it completes;
- `python starter.py check` runs to its end and names the row (exit 1);
- `python starter.py conversation quarantine CONVERSATION_ID SEQ` sets it
  aside, and the conversation's next turn completes.

On SQLite and PostgreSQL, EXAMPLES per database (derandomized).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from sqlalchemy import exc
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

import starter
from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
from tests.support.services import echo
from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer, connect
from tests.support.turns import Turns, running_worker
from tests.test_fuzz_model_responses import LoopThread
from turnstile.engine.contract import TurnStatus
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore

EXAMPLES = 14  # per database: each is three or four real turns
TURN_SECONDS = 5.0

# Every column a turn reads back from chat_message.
COLUMNS = ["role", "content", "tool_calls", "tool_call_id", "is_error", "attributes",
           "created_at", "workflow_id", "execution_chain", "run_id"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=6)
# Shapes close to the real ones, wrong in one place.
NEAR_SHAPES = [
    '[{"id": "c9", "name": "echo"}]', '[{"id": 9, "name": "echo", "arguments": "{}"}]',
    '[{"id": "c9", "name": "echo", "arguments": {"text": "x"}}]', '{"id": "c9"}', "[[]]",
    '{"turnstile.state": "x"}', '{"turnstile.state": {"k": 1}}', '{"turnstile.discarded": 1}',
    '{"turnstile.augmented_user_message": ["x"]}', '{"turnstile.tool_name": 5}',
    '{"k": "\\u0000"}', '[{"id": "c\\u0000", "name": "echo", "arguments": "{}"}]',
    '{"k": "\\ud800"}', "[" * 5000 + "]" * 5000, "nul\x00l", "{", "null", "true", "1e999"]
ROLES = ["robot", "", "USER", "assistant ", "tool", "system", "user", "assistant"]


@dataclass(frozen=True)
class Damage:
    column: str
    kind: str  # bytes | blob | json | shape | role | number | text | huge
    value: Any  # bytes for "bytes"; else what is written

    def sql(self, dialect: str) -> tuple[str, dict[str, Any]] | None:
        """The SET clause and its values, or None: this engine cannot hold it."""
        if self.kind == "bytes":
            if dialect != "sqlite":
                return None
            return f"{self.column} = CAST(:v AS TEXT)", {"v": self.value}
        if self.kind == "blob":  # a value of another type: SQLite keeps a BLOB as it is
            return None if dialect != "sqlite" else (f"{self.column} = :v", {"v": self.value})
        if dialect == "postgresql":
            if self.column == "is_error":
                return None if self.kind != "number" else (
                    f"{self.column} = :v", {"v": bool(self.value)})
            if isinstance(self.value, str) and "\x00" in self.value:
                return None  # PostgreSQL text cannot hold NUL
            return f"{self.column} = :v", {"v": None if self.value is None
                                             else str(self.value)}
        return f"{self.column} = :v", {"v": self.value}


def undecodable() -> st.SearchStrategy[bytes]:
    return st.binary(max_size=12).map(lambda b: b + b"\xff" + b[:3])


@st.composite
def damage(draw: st.DrawFn) -> Damage:
    column = draw(st.sampled_from(COLUMNS))
    kind = draw(st.sampled_from(["bytes", "blob", "json", "shape", "role", "number", "text",
                                 "huge"]))
    if kind == "bytes":
        return Damage(column, kind, draw(undecodable()))
    if kind == "blob":
        return Damage(column, kind, draw(st.binary(max_size=8)))
    if kind == "json":
        return Damage(column, kind, json.dumps(draw(json_values)))
    if kind == "shape":
        return Damage(column, kind, draw(st.sampled_from(NEAR_SHAPES)))
    if kind == "role":
        return Damage(column, kind, draw(st.sampled_from(ROLES)))
    if kind == "number":
        return Damage(column, kind, draw(st.integers(-3, 3) | st.floats(-2, 2)))
    if kind == "text":
        return Damage(column, kind, draw(st.text(max_size=20)))
    return Damage(column, kind, "x" * draw(st.sampled_from([300_000, 2_000_000, 17_000_000])))


def tool_then_answer(request: dict[str, Any]) -> dict[str, Any]:
    messages = request["messages"]
    if messages[-1].get("role") == "tool":
        return text_reply("done")
    return tool_reply((f"e{len(messages)}", "echo", {"text": "hi"}))


@pytest.fixture
def harness(temporal_server: DevServer, db: Database, fake_llm: FakeLLM,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LoopThread, Turns, Client]]:
    fake_llm.default = tool_then_answer
    monkeypatch.setenv("DATABASE_URL", db.url)  # what starter.py reads
    service = Service(name="test", tools=ToolRegistry([echo]))
    lt = LoopThread()
    started, stop = asyncio.Event(), asyncio.Event()
    box: dict[str, Any] = {}

    async def host() -> None:
        client = await connect(temporal_server.address)
        async with running_worker(client, f"dmg-{uuid.uuid4().hex[:8]}", db.url, [service],
                                  llm_url=fake_llm.url) as turns:
            box["turns"], box["client"] = turns, client
            started.set()
            await stop.wait()

    hosting = asyncio.run_coroutine_threadsafe(host(), lt.loop)
    lt.run(asyncio.wait_for(started.wait(), 30), 40)
    yield lt, box["turns"], box["client"]
    lt.loop.call_soon_threadsafe(stop.set)
    hosting.result(30)
    lt.close()


def write_part(db: Database, conv: str, seq: int, d: Damage) -> bool:
    """An image part of the message at `seq`, damaged in column `d.column`."""
    clause = d.sql(db.dialect)
    if clause is None:
        return False
    sql, values = clause
    try:
        with db.connect() as conn:
            conn.execute("INSERT INTO chat_message_part (conversation_id, seq, idx, type, url) "
                         "VALUES (:c, :s, 0, 'image_url', 'https://example.com/a.png')",
                         {"c": conv, "s": seq})
            conn.execute(f"UPDATE chat_message_part SET {sql} WHERE conversation_id = :c "
                         "AND seq = :s", {**values, "c": conv, "s": seq})
    except (exc.IntegrityError, exc.DataError, exc.ProgrammingError):
        return False
    return True


def write(db: Database, conv: str, seq: int, d: Damage) -> bool:
    """Write the damage; False when the database refuses it (it cannot be there)."""
    clause = d.sql(db.dialect)
    if clause is None:
        return False
    sql, values = clause
    try:
        with db.connect() as conn:
            conn.execute(f"UPDATE chat_message SET {sql} WHERE conversation_id = :c "
                         "AND seq = :s", {**values, "c": conv, "s": seq})
    except (exc.IntegrityError, exc.DataError, exc.ProgrammingError):
        return False
    return True


async def timed_turn(turns: Turns, conv: str, message: str) -> tuple[Any, float, list[Any]]:
    loop = asyncio.get_running_loop()
    began = loop.time()
    handle = await turns.start(message, conversation=conv)
    try:
        result = await asyncio.wait_for(handle.result(), 30)
    except TimeoutError:
        await handle.terminate("test: the turn hung")
        raise AssertionError(f"{conv}: the turn did not end") from None
    took = loop.time() - began
    events = [e.event_type for e in (await handle.fetch_history()).events]
    return result, took, events


async def cli(client: Client, *argv: str) -> int:
    return await starter.main(list(argv), client=client)


def exercise(lt: LoopThread, turns: Turns, client: Client, db: Database,
             capsys: pytest.CaptureFixture[str], d: Damage, pick: int,
             part: bool = False) -> str | None:
    """One conversation, one real turn, then `d` written into the row at
    `pick` (modulo its rows; `part`: into an image part of it) and the
    property checked. Returns "damaged", "completed", or None when the
    database cannot hold the damage."""
    memory = MemoryStore(db)
    conv = f"c-dmg-{uuid.uuid4().hex[:10]}"
    first, _, _ = lt.run(timed_turn(turns, conv, "hello"), 60)
    assert first.status == TurnStatus.COMPLETED, first.error
    with db.connect() as conn:
        seqs = [r["seq"] for r in fetchall(conn, "SELECT seq FROM chat_message WHERE "
                                           "conversation_id = :c ORDER BY seq", {"c": conv})]
    seq = seqs[pick % len(seqs)]
    if not (write_part(db, conv, seq, d) if part else write(db, conv, seq, d)):
        return None
    damaged = [x for x in memory.damaged(conv) if x.seq == seq]
    result, took, events = lt.run(timed_turn(turns, conv, "again"), 60)
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events, d
    assert took < TURN_SECONDS, (d, took, result.status)
    capsys.readouterr()
    code = lt.run(cli(client, "check", "--conversation", conv), 60)
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed and "disagreement(s)" in printed[-1], printed  # ran to its end
    if not damaged:
        assert result.status == TurnStatus.COMPLETED, (d, result.error)
        assert not [line for line in printed if line.startswith("damaged:")], printed
        return "completed"
    assert result.status in (TurnStatus.FAILED, TurnStatus.REFUSED), (d, result)
    assert result.error is not None and result.error.type == "DamagedRow", (d, result.error)
    assert f"conversation {conv}" in result.error.message, result.error
    assert f"seq {seq}" in result.error.message, result.error
    assert code == 1, printed
    assert any(line.startswith(f"damaged: {conv} seq {seq} ") for line in printed), printed
    assert lt.run(cli(client, "conversation", "quarantine", conv, str(seq), "--by",
                      "ops-lead"), 60) == 0
    with db.connect() as conn:
        kept = fetchall(conn, "SELECT quarantined_by, reason FROM quarantined_message "
                              "WHERE conversation_id = :c AND seq = :s", {"c": conv, "s": seq})
    assert kept == [{"quarantined_by": "ops-lead", "reason": damaged[0].what}], kept
    after, _, _ = lt.run(timed_turn(turns, conv, "and now?"), 60)
    assert after.status == TurnStatus.COMPLETED, (d, after.error)
    assert memory.damaged(conv) == []
    return "damaged"


def test_a_damaged_row_ends_the_turn_named_check_names_it_quarantine_frees_it(
        harness: tuple[LoopThread, Turns, Client], db: Database,
        capsys: pytest.CaptureFixture[str]) -> None:
    lt, turns, client = harness
    outcomes: set[str | None] = set()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(d=damage(), pick=st.integers(0, 20))
    def one(d: Damage, pick: int) -> None:
        outcomes.add(exercise(lt, turns, client, db, capsys, d, pick))

    one()
    assert {"completed", "damaged"} <= outcomes, outcomes  # both sides were exercised


# One of each kind of damage, each where a turn reads it (seq: 0 the user's
# message, 1 the call, 2 its result, 3 the answer).
EACH_KIND = [
    (Damage("content", "bytes", b"caf\xe9"), 0, False),
    (Damage("tool_calls", "bytes", b"[\xff]"), 1, False),
    (Damage("tool_calls", "shape", '{"id": "c9", "name": "echo"}'), 1, False),
    (Damage("tool_calls", "shape", '[{"id": "c9", "name": "echo", "arguments": {}}]'), 1,
     False),
    (Damage("attributes", "shape", "{not json"), 2, False),
    (Damage("attributes", "shape", '{"turnstile.state": ["not", "an", "object"]}'), 2, False),
    (Damage("role", "role", "robot"), 3, False),
    (Damage("is_error", "text", "yes"), 2, False),
    (Damage("tool_call_id", "blob", b"c1"), 2, False),
    (Damage("content", "text", "a\x00b"), 3, False),
    (Damage("attributes", "shape", '{"k": "\\ud800"}'), 3, False),
    (Damage("content", "huge", "x" * 17_000_000), 3, False),
    (Damage("url", "bytes", b"https://\xff"), 0, True),
    (Damage("type", "blob", b"\x01"), 0, True),
]


def test_each_kind_of_damage_ends_its_turn_named_and_quarantine_frees_it(
        harness: tuple[LoopThread, Turns, Client], db: Database,
        capsys: pytest.CaptureFixture[str]) -> None:
    lt, turns, client = harness
    outcomes = [exercise(lt, turns, client, db, capsys, d, pick, part)
                for d, pick, part in EACH_KIND]
    # Each kind the engine can hold is damage, named; PostgreSQL cannot hold
    # bytes that are not UTF-8, BLOBs or NUL in text, or text in a flag.
    pairs = list(zip(EACH_KIND, outcomes, strict=True))
    assert all(o in ("damaged", None) for o in outcomes), pairs
    held = {d.kind for (d, _, _), o in zip(EACH_KIND, outcomes, strict=True) if o}
    assert held == ({"bytes", "blob", "shape", "role", "text", "huge"}
                    if db.dialect == "sqlite" else {"shape", "role", "huge"}), held


def test_check_runs_past_every_damaged_conversation(
        harness: tuple[LoopThread, Turns, Client], db: Database,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Several damaged conversations at once, the whole database checked: each
    is named, the check reaches its count line, exit 1."""
    lt, turns, client = harness
    damages = [Damage("tool_calls", "shape", '{"id": "c9"}'),
               Damage("attributes", "shape", "{"), Damage("role", "role", "robot"),
               Damage("content", "bytes", b"\xc3\x28")]
    planted = []
    for d in damages:
        conv = f"c-all-{uuid.uuid4().hex[:8]}"
        first, _, _ = lt.run(timed_turn(turns, conv, "hello"), 60)
        assert first.status == TurnStatus.COMPLETED, first.error
        seq = 2 if d.column in ("attributes", "content") else 1
        if write(db, conv, seq, d):
            planted.append((conv, seq))
    capsys.readouterr()
    assert lt.run(cli(client, "check"), 60) == 1
    printed = capsys.readouterr().out.strip().splitlines()
    assert "disagreement(s)" in printed[-1], printed
    for conv, seq in planted:
        assert any(line.startswith(f"damaged: {conv} seq {seq} ") for line in printed), printed
