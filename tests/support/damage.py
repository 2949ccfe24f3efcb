"""Damage written into stored rows, and the property every damaged row must
hold through real turns (tests/test_damaged_rows_turns.py runs it bounded,
bench/damaged_rows.py longer): the next turn ends within 5 s, `DamagedRow`
naming the conversation and seq when the rule (turnstile.stores.damage) says
the row is damaged, else it completes; `starter.py check` runs to its end and
names the row (exit 1); `starter.py conversation quarantine` sets it aside and
the next turn completes."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from hypothesis import strategies as st
from sqlalchemy import exc
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.support.sql import fetchall
from tests.support.turns import Turns
from turnstile.cli import starter
from turnstile.engine.contract import TurnStatus
from turnstile.stores.db import Database
from turnstile.stores.quarantine import damaged_rows
from turnstile.testing import text_reply, tool_reply

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


def write_part(db: Database, conv: str, seq: int, d: Damage) -> bool:
    """An image part of the message at `seq`, damaged in column `d.column`."""
    clause = d.sql(db.dialect)
    if clause is None:
        return False
    sql, values = clause
    where = {"c": conv, "s": seq}
    return _written(db, [
        ("INSERT INTO chat_message_part (conversation_id, seq, idx, type, url) "
         "VALUES (:c, :s, 0, 'image_url', 'https://example.com/a.png')", where),
        (f"UPDATE chat_message_part SET {sql} WHERE conversation_id = :c AND seq = :s",
         {**values, **where})])


def write(db: Database, conv: str, seq: int, d: Damage) -> bool:
    """Write the damage; False when the database refuses it (it cannot be there)."""
    clause = d.sql(db.dialect)
    if clause is None:
        return False
    sql, values = clause
    return _written(db, [(f"UPDATE chat_message SET {sql} WHERE conversation_id = :c "
                          "AND seq = :s", {**values, "c": conv, "s": seq})])


def _written(db: Database, statements: list[tuple[str, dict[str, Any]]]) -> bool:
    """Run the statements in one transaction; False when the database refuses
    what they write (it cannot be there)."""
    try:
        with db.connect() as conn:
            for sql, values in statements:
                conn.execute(sql, values)
    except (exc.IntegrityError, exc.DataError, exc.ProgrammingError):
        return False  # the database refuses it (PostgreSQL: NUL, bytes)
    except exc.OperationalError as err:
        if "index row size" not in str(err):  # PostgreSQL: a huge role, in an index
            raise
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


def check(lt: Runs, client: Client, *argv: str) -> tuple[int, list[str]]:
    """`starter.py check ARGV` in process: its exit code and printed lines."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = lt.run(cli(client, "check", *argv), 60)
    return code, printed.getvalue().strip().splitlines()


class Runs(Protocol):
    """Runs a coroutine on the worker's loop (from Hypothesis' thread)."""

    def run(self, coro: Any, timeout: float) -> Any: ...


@dataclass(frozen=True)
class Outcome:
    kind: str  # "damaged" | "completed" | "unwritable" (the database refuses the damage)
    seconds: float = 0.0  # the turn on the damaged conversation, start to end
    error_type: str | None = None


def exercise(lt: Runs, turns: Turns, client: Client, db: Database, d: Damage, pick: int,
             part: bool = False) -> Outcome:
    """One conversation, one real turn, then `d` written into the row at
    `pick` (modulo its rows; `part`: into an image part of it) and the
    property checked (AssertionError when it fails). `starter.py` reads the
    database from DATABASE_URL: set it to `db`'s URL."""
    conv = f"c-dmg-{uuid.uuid4().hex[:10]}"
    first, _, _ = lt.run(timed_turn(turns, conv, "hello"), 60)
    assert first.status == TurnStatus.COMPLETED, first.error
    with db.connect() as conn:
        seqs = [r["seq"] for r in fetchall(conn, "SELECT seq FROM chat_message WHERE "
                                           "conversation_id = :c ORDER BY seq", {"c": conv})]
    seq = seqs[pick % len(seqs)]
    if not (write_part(db, conv, seq, d) if part else write(db, conv, seq, d)):
        return Outcome("unwritable")
    damaged = [x for x in damaged_rows(db, conv) if x.seq == seq]
    result, took, events = lt.run(timed_turn(turns, conv, "again"), 60)
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events, d
    assert took < TURN_SECONDS, (d, took, result.status)
    code, printed = check(lt, client, "--conversation", conv)
    assert printed and "disagreement(s)" in printed[-1], printed  # ran to its end
    if not damaged:
        assert result.status == TurnStatus.COMPLETED, (d, result.error)
        assert not [line for line in printed if line.startswith("damaged:")], printed
        return Outcome("completed", took)
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
    assert damaged_rows(db, conv) == []
    return Outcome("damaged", took, result.error.type)


