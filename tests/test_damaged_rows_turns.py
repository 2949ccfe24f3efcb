"""Property: a damaged row is named, not retried, and does not brick its
conversation (turnstile.stores.damage).

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

import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from temporalio.client import Client

from tests.support.damage import (
    Damage,
    check,
    damage,
    exercise,
    timed_turn,
    tool_then_answer,
    write,
)
from tests.support.loop_thread import LoopThread, hosted_worker
from tests.support.services import echo
from tests.support.temporal_server import DevServer
from tests.support.turns import Turns
from turnstile.engine.contract import TurnStatus
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer

EXAMPLES = 14  # per database: each is three or four real turns


@pytest.fixture
def harness(temporal_server: DevServer, db: Database, fake_llm: FakeOpenAIServer,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LoopThread, Turns, Client]]:
    fake_llm.default = tool_then_answer
    monkeypatch.setenv("DATABASE_URL", db.url)  # what starter.py reads
    service = Service(name="test", tools=ToolRegistry([echo]))
    with hosted_worker(temporal_server.address, f"dmg-{uuid.uuid4().hex[:8]}", db.url,
                       [service], llm_url=fake_llm.url) as (lt, turns):
        yield lt, turns, turns.client


def test_a_damaged_row_ends_the_turn_named_check_names_it_quarantine_frees_it(
        harness: tuple[LoopThread, Turns, Client], db: Database) -> None:
    lt, turns, client = harness
    outcomes: set[str] = set()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(d=damage(), pick=st.integers(0, 20))
    def one(d: Damage, pick: int) -> None:
        outcomes.add(exercise(lt, turns, client, db, d, pick).kind)

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
    (Damage("tool_calls", "shape", '[{"id": "c\\u0000", "name": "echo", "arguments": "{}"}]'),
     1, False),
    (Damage("content", "huge", "x" * 17_000_000), 3, False),
    (Damage("url", "bytes", b"https://\xff"), 0, True),
    (Damage("type", "blob", b"\x01"), 0, True),
]


def test_each_kind_of_damage_ends_its_turn_named_and_quarantine_frees_it(
        harness: tuple[LoopThread, Turns, Client], db: Database) -> None:
    lt, turns, client = harness
    outcomes = [exercise(lt, turns, client, db, d, pick, part).kind
                for d, pick, part in EACH_KIND]
    # Each kind the engine can hold is damage, named; PostgreSQL cannot hold
    # bytes that are not UTF-8, BLOBs or NUL in text, or text in a flag.
    pairs = list(zip(EACH_KIND, outcomes, strict=True))
    assert all(o in ("damaged", "unwritable") for o in outcomes), pairs
    held = {d.kind for (d, _, _), o in pairs if o == "damaged"}
    assert held == ({"bytes", "blob", "shape", "role", "text", "huge"}
                    if db.dialect == "sqlite" else {"shape", "role", "huge"}), held


def test_check_runs_past_every_damaged_conversation(
        harness: tuple[LoopThread, Turns, Client], db: Database) -> None:
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
    code, printed = check(lt, client)
    assert code == 1, printed
    assert "disagreement(s)" in printed[-1], printed
    for conv, seq in planted:
        assert any(line.startswith(f"damaged: {conv} seq {seq} ") for line in printed), printed
