"""Memory slots and the tool ledger on both databases."""

from __future__ import annotations

import pytest

from turnstile.engine.contract import AuditStatus, CallStatus
from turnstile.engine.errors import ConversationOwnershipError, MemoryConflictError
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.stores.call_key import CallKey
from turnstile.stores.db import Database
from turnstile.stores.journal import CallJournal, Ending, Start
from turnstile.stores.ledger import LedgerRow, LedgerStatus, ToolLedger
from turnstile.stores.memory import MemoryStore


def _start(call_id: str, name: str) -> Start:
    return Start(workflow_id="wf", chain="", conversation_id="c", user_id="alice",
                 call=ToolCall(id=call_id, name=name))


def test_ledger_tells_each_attempt_what_happened(db: Database) -> None:
    journal = CallJournal(db, MemoryStore(db))
    MemoryStore(db).check_owner("c", "alice")
    first = journal.begin(_start("c1", "unlock"), rerun_lost=False)
    assert first.fresh
    lost = journal.begin(_start("c1", "unlock"), rerun_lost=False)  # first attempt vanished
    assert not lost.fresh and lost.status == "STARTED"
    journal.finish(Ending(workflow_id="wf", chain="", conversation_id="c", user_id="alice",
                          call=ToolCall(id="c1", name="unlock"), seq=0,
                          outcome=CallStatus.COMPLETED, text='{"ok": true}', is_error=False,
                          audit_status=AuditStatus.COMPLETED, state={"unlocked_by": "x"},
                          attempt=first.attempts))
    again = journal.begin(_start("c1", "unlock"), rerun_lost=True)  # completion was lost
    assert (again.status, again.fresh, again.result) == ("COMPLETED", False, '{"ok": true}')
    assert again.outcome == "completed" and again.state == {"unlocked_by": "x"}
    claim = journal.begin(_start("c2", "flaky"), rerun_lost=False).attempts
    journal.attempt_failed(CallKey("wf", "", "c2"), "boom", claim)  # a clean failure may be retried
    retry = journal.begin(_start("c2", "flaky"), rerun_lost=False)
    assert retry.fresh and retry.attempts == 2
    assert ToolLedger(db).row("wf", "c2") == LedgerRow(
        tool_name="flaky", status=LedgerStatus.STARTED, attempts=2, result="boom")


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
