"""Memory slots and the tool ledger on both databases."""

from __future__ import annotations

import pytest

from turnstile.engine.contract import CallStatus
from turnstile.engine.errors import ConversationOwnershipError, MemoryConflictError
from turnstile.engine.messages import ChatMessage
from turnstile.stores.db import Database
from turnstile.stores.ledger import ToolLedger
from turnstile.stores.memory import MemoryStore


def test_ledger_tells_each_attempt_what_happened(db: Database) -> None:
    ledger = ToolLedger(db)
    first = ledger.begin("wf", "c1", "unlock", rerun_lost=False)
    assert first.fresh
    lost = ledger.begin("wf", "c1", "unlock", rerun_lost=False)  # first attempt vanished
    assert not lost.fresh and lost.status == "STARTED"
    ledger.complete("wf", "c1", '{"ok": true}', False, CallStatus.COMPLETED, {"unlocked_by": "x"})
    again = ledger.begin("wf", "c1", "unlock", rerun_lost=True)  # completion was lost
    assert (again.status, again.fresh, again.result) == ("COMPLETED", False, '{"ok": true}')
    assert again.outcome == "completed" and again.state == {"unlocked_by": "x"}
    ledger.begin("wf", "c2", "flaky", rerun_lost=False)
    ledger.attempt_failed("wf", "c2", "boom")  # a clean failure may be retried
    retry = ledger.begin("wf", "c2", "flaky", rerun_lost=False)
    assert retry.fresh and retry.attempts == 2


def test_memory_slots_are_idempotent_and_owned(db: Database) -> None:
    memory = MemoryStore(db)
    msgs = [ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="yo")]
    memory.check_owner("c", "alice")
    memory.append("c", 0, msgs, "wf-1")
    memory.append("c", 0, msgs, "wf-1")  # a retried activity: no duplicate
    assert [m.content for m in memory.messages("c")] == ["hi", "yo"]
    with pytest.raises(MemoryConflictError):
        memory.append("c", 1, [ChatMessage(role="user", content="other")], "wf-2")
    with pytest.raises(ConversationOwnershipError):
        memory.check_owner("c", "mallory")
    snap = memory.snapshot("c", "alice")
    assert (snap.next_seq, snap.message_count) == (2, 2)
