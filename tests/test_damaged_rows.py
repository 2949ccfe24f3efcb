"""Damaged rows of memory, at the stores (turnstile.stores.damage): every
reader of memory names a damaged row (`DamagedRow`: conversation and seq)
instead of failing as an outage — text that is not UTF-8 on SQLite through
both statement paths (SQLAlchemy's and the prebuilt driver path), JSON of the
wrong shape, roles and types on both engines; the check's scan lists them all
and reads on past them; quarantine keeps the row's bytes, with who, when and
why, and takes it out of memory. On SQLite and PostgreSQL (the `db` fixture);
the turns themselves: tests/test_damaged_rows_turns.py."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from sqlalchemy import exc

from tests.support.sql import fetchall, fetchone
from turnstile.activities.data_errors import classified
from turnstile.cli import starter
from turnstile.cli.conversation import quarantine as quarantine_command
from turnstile.engine.errors import DamagedRow
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.stores.damage import Undecodable, message_damage
from turnstile.stores.db import Database
from turnstile.stores.journal_repair import repair_orphans
from turnstile.stores.ledger import ToolLedger
from turnstile.stores.memory import MemoryStore, MessageRow
from turnstile.stores.memory_tables import GET, NEWEST_PAGE, SYSTEM_PROMPT
from turnstile.stores.prebuilt import driver_form
from turnstile.stores.quarantine import NotDamaged, damaged_rows, quarantine

CALL = ToolCall(id="c1", name="echo", arguments='{"text": "hi"}')


def conversation(db: Database, conv: str) -> MemoryStore:
    memory = MemoryStore(db)
    memory.check_owner(conv, "alice")
    memory.append(conv, 0, [
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="hello"),
        ChatMessage(role="assistant", tool_calls=[CALL]),
        ChatMessage(role="tool", tool_call_id="c1", content="hi",
                    attributes={"turnstile.tool_name": "echo"}),
        ChatMessage(role="assistant", content="done"),
    ], "t-1")
    return memory


def damage(db: Database, conv: str, seq: int, column: str, value: object,
           raw_sql: str | None = None) -> None:
    """Write `value` (or the SQL expression `raw_sql`) into a column of a row."""
    with db.connect() as conn:
        expr = raw_sql or ":v"
        conn.execute(f"UPDATE chat_message SET {column} = {expr} "
                     "WHERE conversation_id = :c AND seq = :s",
                     {"v": value, "c": conv, "s": seq})


def named(err: pytest.ExceptionInfo[DamagedRow], conv: str, seq: int) -> None:
    assert err.value.conversation_id == conv and err.value.seq == seq, err.value
    assert f"conversation {conv}" in str(err.value) and f"seq {seq}" in str(err.value)


def test_the_rule_names_what_is_wrong() -> None:
    good = {"conversation_id": "c", "seq": 1, "role": "assistant", "content": None,
            "tool_calls": json.dumps([CALL.model_dump()]), "tool_call_id": None,
            "is_error": 0, "attributes": '{"turnstile.state": {"a": 1}}'}
    assert message_damage(good) is None
    assert message_damage({**good, "is_error": True}) is None  # PostgreSQL's BOOLEAN
    for change, words in [
        ({"role": "robot"}, "is not a role"),
        ({"role": None}, "role"),
        ({"content": Undecodable(b"\xff")}, "content is not UTF-8"),
        ({"content": 7}, "content holds a int"),
        ({"content": "a\x00b"}, "NUL"),
        ({"content": "\ud800"}, "lone surrogate"),
        ({"tool_calls": "{"}, "tool_calls is not JSON"),
        ({"tool_calls": '{"id": "x"}'}, "not a list"),
        ({"tool_calls": '[{"id": 1, "name": "echo"}]'}, "item 0 is not a call"),
        ({"tool_calls": '[{"id": "x", "name": "echo", "arguments": {}}]'}, "item 0"),
        ({"tool_calls": '[{"id": "x", "name": "e", "arguments": "\\u0000"}]'}, "NUL"),
        ({"attributes": "[]"}, "not an object"),
        ({"attributes": '{"turnstile.state": [1]}'}, "turnstile.state is not an object"),
        ({"attributes": '{"turnstile.augmented_user_message": 3}'}, "is not text"),
        ({"attributes": "[" * 100_000}, "attributes is not JSON"),
        ({"is_error": 2}, "is_error"),
        ({"is_error": "yes"}, "is_error"),
        ({"tool_call_id": 5}, "tool_call_id"),
    ]:
        problem = message_damage({**good, **change})
        assert problem is not None and words in problem, (change, problem)


def test_undecodable_text_is_a_named_damaged_row_on_both_statement_paths(
        db: Database) -> None:
    if db.dialect != "sqlite":
        pytest.skip("PostgreSQL refuses text that is not UTF-8 on write")
    conv = "c-bytes"
    memory = conversation(db, conv)
    damage(db, conv, 3, "content", None, raw_sql="CAST(X'48FF49' AS TEXT)")
    with db.connect() as conn:  # the prebuilt statements take the driver path here
        assert driver_form(NEWEST_PAGE, conn.sa.dialect, {"conv": conv, "n": 64}) is not None
        assert driver_form(GET, conn.sa.dialect, {"conv": conv, "seq": 3}) is not None
    with pytest.raises(DamagedRow) as by_driver:
        memory.tail(conv, None, lambda _: False)
    named(by_driver, conv, 3)
    assert "content is not UTF-8" in str(by_driver.value)
    with pytest.raises(DamagedRow) as by_sqlalchemy:  # not prebuilt: SQLAlchemy's path
        memory.messages(conv)
    named(by_sqlalchemy, conv, 3)
    assert str(by_driver.value) == str(by_sqlalchemy.value)
    with pytest.raises(DamagedRow) as one:
        memory.get(conv, 3)
    named(one, conv, 3)
    # The connection that met the error still works, in the same transaction.
    with db.connect() as conn:
        with pytest.raises(DamagedRow):
            memory.messages(conv, conn=conn)
        assert memory.get(conv, 1, conn=conn) is not None
    # The activity's failure: non-retryable, typed, though an OperationalError lay beneath.
    failure = classified(by_driver.value, "turnstile.call_model")
    assert failure is not None and failure.type == "DamagedRow" and failure.non_retryable


def test_undecodable_calls_and_system_prompt_are_named_where_read(db: Database) -> None:
    if db.dialect != "sqlite":
        pytest.skip("PostgreSQL refuses text that is not UTF-8 on write")
    conv = "c-calls"
    memory = conversation(db, conv)
    damage(db, conv, 2, "tool_calls", None, raw_sql="CAST(X'5BFF5D' AS TEXT)")
    with db.connect() as conn, pytest.raises(DamagedRow) as repair:
        repair_orphans(conn, memory, True, conv, "t-2")  # begin_turn's read
    named(repair, conv, 2)
    damage(db, conv, 0, "content", None, raw_sql="CAST(X'FE' AS TEXT)")
    with db.connect() as conn:
        assert driver_form(SYSTEM_PROMPT, conn.sa.dialect, {"conv": conv}) is not None
    with pytest.raises(DamagedRow) as snapshot:
        memory.snapshot(conv, "alice")
    named(snapshot, conv, 0)


@pytest.mark.parametrize("column,value", [
    ("tool_calls", '{"not": "a list"}'), ("tool_calls", "[1, 2"), ("role", "robot"),
    ("attributes", '"text"'), ("attributes", '{"turnstile.state": "x"}'),
    ("content", "x" * 17_000_000)])
def test_wrong_shapes_are_named_on_both_engines(db: Database, column: str, value: str) -> None:
    conv = "c-shape"
    memory = conversation(db, conv)
    seq = 3 if column in ("attributes", "content") else 2
    damage(db, conv, seq, column, value)
    for read in (lambda: memory.messages(conv), lambda: memory.tail(conv, None, lambda _: True),
                 lambda: memory.get(conv, seq)):
        with pytest.raises(DamagedRow) as err:
            read()
        named(err, conv, seq)
    if column == "attributes":
        damage(db, conv, seq, "role", "tool")
        with pytest.raises(DamagedRow):
            memory.state(conv) if "state" in value else memory.messages(conv)


def test_the_scan_lists_every_damaged_row_and_quarantine_sets_one_aside(
        db: Database) -> None:
    memory = conversation(db, "c-a")
    conversation(db, "c-b")
    conversation(db, "c-ok")
    if db.dialect == "sqlite":
        damage(db, "c-a", 1, "content", None, raw_sql="CAST(X'C328' AS TEXT)")
    else:
        damage(db, "c-a", 1, "role", "robot")
    damage(db, "c-b", 2, "tool_calls", '[{"id": 1}]')
    damage(db, "c-b", 3, "attributes", "not json")
    found = damaged_rows(db)
    assert [(d.conversation_id, d.seq) for d in found] == [("c-a", 1), ("c-b", 2), ("c-b", 3)]
    assert found[0].line().startswith("damaged: c-a seq 1 ")
    assert damaged_rows(db, "c-ok") == []
    with pytest.raises(NotDamaged):
        quarantine(db, "c-ok", 1, "ops", None)
    with pytest.raises(LookupError):
        quarantine(db, "c-a", 99, "ops", None)
    with db.connect() as conn:
        before = fetchone(conn, "SELECT CAST(content AS BLOB) AS b FROM chat_message "
                          "WHERE conversation_id = 'c-a' AND seq = 1"
                          if db.dialect == "sqlite" else
                          "SELECT role AS b FROM chat_message "
                          "WHERE conversation_id = 'c-a' AND seq = 1")
    done = quarantine(db, "c-a", 1, "ops-lead", None)
    assert done.by == "ops-lead" and done.reason == found[0].what
    with db.connect() as conn:
        kept = fetchall(conn, "SELECT conversation_id, seq, quarantined_by, quarantined_at, "
                        "reason, " + ("CAST(content AS BLOB)" if db.dialect == "sqlite"
                                      else "role") + " AS b FROM quarantined_message")
    assert len(kept) == 1 and kept[0]["quarantined_by"] == "ops-lead"
    assert kept[0]["b"] == before["b"]  # type: ignore[index]  # the bytes as they were
    assert kept[0]["quarantined_at"] == done.at and kept[0]["reason"] == done.reason
    assert [m.content for m in memory.messages("c-a")] == ["be brief", None, "hi", "done"]
    assert damaged_rows(db, "c-a") == []


def test_the_quarantine_command_audits_who_and_why(db: Database,
                                                    capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    conversation(db, "c-q")
    damage(db, "c-q", 4, "role", "robot")

    def run(*argv: str, by: str | None = "ops", reason: str | None = None,
            force: bool = False) -> int:
        return quarantine_command(db, argparse.Namespace(
            conversation_id=argv[0], seq=int(argv[1]), by=by, reason=reason, force=force))

    assert run("c-q", "1") == 2 and "is not damaged" in capsys.readouterr().err
    assert run("c-q", "4", by="bad\x00name") == 2
    assert run("c-q", "4", reason="disk copy\x00 went wrong") == 0
    assert "quarantined: c-q seq 4 by ops" in capsys.readouterr().out
    assert run("c-q", "4") == 1  # gone from memory
    with db.connect() as conn:
        row = fetchone(conn, "SELECT role, reason FROM quarantined_message")
    assert row == {"role": "robot", "reason": "disk copy\ufffd went wrong"}
    assert run("c-q", "1", force=True) == 0  # an operator may set aside any row


def test_a_decode_error_of_a_write_is_not_retried_as_a_read(db: Database) -> None:
    """Only SELECTs are read again tolerantly; other statements raise as they were."""
    if db.dialect != "sqlite":
        pytest.skip("SQLite only")
    conversation(db, "c-w")
    damage(db, "c-w", 1, "content", None, raw_sql="CAST(X'FF' AS TEXT)")
    with db.connect() as conn, pytest.raises(exc.OperationalError):
        conn.execute("SELECT content FROM chat_message WHERE conversation_id = 'c-w'").all()


def test_undecodable_text_elsewhere_is_named_by_its_table(db: Database) -> None:
    """Any typed read of the stores: a call's ledger row with bytes that are
    not UTF-8 is a `DamagedRow` naming the table, not an outage."""
    if db.dialect != "sqlite":
        pytest.skip("PostgreSQL refuses text that is not UTF-8 on write")
    with db.connect() as conn:
        conn.execute("INSERT INTO tool_call_ledger (workflow_id, execution_chain, tool_call_id, "
                     "tool_name, status, result, started_at) VALUES ('t-1', '', 'c1', 'echo', "
                     "'COMPLETED', CAST(X'7BFF7D' AS TEXT), '2026-12-06')")
    with pytest.raises(DamagedRow) as err:
        ToolLedger(db).row("t-1", "c1")
    assert err.value.table == "tool_call_ledger" and "result is not UTF-8" in str(err.value)
    failure = classified(err.value, "turnstile.execute_tool")
    assert failure is not None and failure.non_retryable and failure.type == "DamagedRow"


SOUND = {"conversation_id": "c", "seq": 1, "role": "assistant", "content": "hi",
         "tool_calls": json.dumps([CALL.model_dump()]), "tool_call_id": None, "is_error": 0,
         "attributes": '{"turnstile.tool_name": "echo"}', "created_at": "2026-12-06",
         "workflow_id": "t-1", "execution_chain": None, "run_id": None}
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_values = st.one_of(
    st.none(), st.integers(-2, 3), st.booleans(), st.floats(allow_nan=False),
    st.text(max_size=10), st.binary(max_size=6), st.binary(max_size=6).map(Undecodable),
    st.sampled_from(["system", "user", "tool", "robot", "\x00", "\ud800", '"\\u0000"',
                     '[{"id": "a", "name": "b"}]', '{"turnstile.state": 1}',
                     '{"turnstile.state": {}}', '[{"id": "a", "name": "b", "arguments": 1}]',
                     '"\\ud83d\\ude00"', "[" * 3000, "{}", '{"a": 1}', '"ab"', "[]"]),
    _json.map(json.dumps))


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(changes=st.dictionaries(st.sampled_from(sorted(set(SOUND) - {"conversation_id", "seq"})),
                               _values, min_size=1, max_size=3))
def test_reading_a_row_agrees_with_the_rule(changes: dict[str, object]) -> None:
    """Memory's read (parsed once, the rule only on doubt) and the rule agree
    on every row: damaged rows raise DamagedRow naming it, others read."""
    row = {**SOUND, **changes}
    problem = message_damage(row)
    if problem is None:
        msg = MessageRow(**row).message()
        assert msg.role == row["role"]
    else:
        with pytest.raises(DamagedRow) as err:
            MessageRow(**row).message()
        assert err.value.seq == 1 and err.value.what == problem


def test_conversation_show_names_a_damaged_row(db: Database, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    conversation(db, "c-show")
    damage(db, "c-show", 2, "tool_calls", "[1]")
    monkeypatch.setenv("DATABASE_URL", db.url)
    assert asyncio.run(starter.main(["conversation", "show", "c-show"])) == 1
    err = capsys.readouterr().err
    assert "conversation c-show has a damaged row in chat_message (seq 2)" in err
    assert "starter.py conversation quarantine c-show 2" in err
