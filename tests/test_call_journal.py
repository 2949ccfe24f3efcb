"""The call journal writes the facts of a call's end together or not at all:
ledger row, audit row, approval decision, result message. On
SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest

from turnstile.engine import attributes as attr
from turnstile.engine.contract import ApprovalDecision, AuditStatus, CallStatus
from turnstile.engine.errors import MemoryConflictError
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.stores.audit import AuditLog, execution_id
from turnstile.stores.db import Database
from turnstile.stores.journal import CallJournal, Ending
from turnstile.stores.ledger import ToolLedger
from turnstile.stores.memory import MemoryStore


def journal(db: Database) -> CallJournal:
    return CallJournal(db, MemoryStore(db), ToolLedger(db), AuditLog(db))


def ending(wf: str, conv: str, seq: int) -> Ending:
    call = ToolCall(id="call_0", name="createEmailTask", arguments='{"to": "ops@example.com"}')
    message = ChatMessage(role="tool", content='{"taskId": "t"}', tool_call_id="call_0",
                          attributes={attr.TOOL_NAME: call.name,
                                      attr.OUTCOME: CallStatus.COMPLETED.value})
    return Ending(workflow_id=wf, chain="run-1", conversation_id=conv, user_id="alice",
                  call=call, seq=seq, message=message, audit_status=AuditStatus.COMPLETED,
                  decision=ApprovalDecision(tool_call_id="call_0", tool_name=call.name,
                                            approved=True, reviewer="bob", note="",
                                            decided_at="2026-12-01T00:00:00+00:00"))


def facts(db: Database, wf: str) -> dict[str, int]:
    with db.connect() as conn:
        return {t: conn.fetchone(f"SELECT COUNT(*) AS n FROM {t} WHERE workflow_id = :wf",
                                 {"wf": wf})["n"]  # type: ignore[index]
                for t in ("tool_call_ledger", "tool_execution_log", "approval_decision",
                          "chat_message")}


def test_finish_writes_every_fact_or_none(db: Database) -> None:
    wf, conv = f"wf-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    j = journal(db)
    MemoryStore(db).check_owner(conv, "alice")
    j.ledger.begin(wf, "call_0", "createEmailTask", rerun_lost=False, chain="run-1")
    # The slot is taken by another turn: nothing of this ending may be written.
    MemoryStore(db).put(conv, 5, ChatMessage(role="user", content="x"), "other-turn")
    with pytest.raises(MemoryConflictError):
        j.finish(ending(wf, conv, 5))
    assert facts(db, wf) == {"tool_call_ledger": 1, "tool_execution_log": 0,
                             "approval_decision": 0, "chat_message": 0}
    assert ToolLedger(db).result(wf, "call_0", "run-1") is None  # still STARTED

    j.finish(ending(wf, conv, 6))
    j.finish(ending(wf, conv, 6))  # a retried attempt rewrites the same facts
    assert facts(db, wf) == {"tool_call_ledger": 1, "tool_execution_log": 1,
                             "approval_decision": 1, "chat_message": 1}
    [row] = AuditLog(db).rows(wf)
    assert row["execution_id"] == execution_id(wf, "call_0", "run-1") == f"{wf}/run-1/call_0"
    assert row["status"] == "COMPLETED" and row["execution_chain"] == "run-1"
    assert ToolLedger(db).result(wf, "call_0", "run-1") == '{"taskId": "t"}'


def test_a_failed_attempt_is_one_ending_in_one_transaction(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger lets a retry claim the call and the audit row says why —
    together or not at all (they used to be two transactions of the activity)."""
    wf = f"wf-{uuid.uuid4().hex[:8]}"
    j = journal(db)
    entry = j.ledger.begin(wf, "call_0", "sendMoney", rerun_lost=False, chain="run-1")
    j.audit.started(workflow_id=wf, call_id="call_0", conversation_id="c", user_id="alice",
                    tool_name="sendMoney", arguments="{}", chain="run-1")
    claim = entry.attempts

    def broken(**_: object) -> None:
        raise RuntimeError("the audit write failed")

    monkeypatch.setattr(j.audit, "finished", broken)
    with pytest.raises(RuntimeError):
        j.attempt_failed(wf, "run-1", "call_0", "backend down", claim)
    assert ToolLedger(db).status(wf, "call_0", "run-1") == "STARTED"  # rolled back with it
    monkeypatch.undo()
    j.attempt_failed(wf, "run-1", "call_0", "backend down", claim)
    assert ToolLedger(db).status(wf, "call_0", "run-1") == "ATTEMPT_FAILED"
    [row] = AuditLog(db).rows(wf)
    assert (row["status"], row["error_message"]) == ("FAILED", "backend down")
