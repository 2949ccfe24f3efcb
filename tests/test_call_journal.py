"""The call journal writes the facts of a call's end together or not at all:
ledger row, audit row, approval decision, result message. On
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

import pytest

from tests.support.sql import fetchone
from turnstile.engine import attributes as attr
from turnstile.engine.contract import ApprovalDecision, AuditStatus, CallStatus
from turnstile.engine.errors import CallTakenOver, MemoryConflictError
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.inbox import records
from turnstile.stores import journal_writes
from turnstile.stores.audit import AuditLog, execution_id
from turnstile.stores.call_key import CallKey
from turnstile.stores.db import Database
from turnstile.stores.journal import CallJournal, Ending, Start
from turnstile.stores.ledger import ToolLedger
from turnstile.stores.memory import MemoryStore
from turnstile.stores.transcript import read_transcript

CALL = ToolCall(id="call_0", name="createEmailTask", arguments='{"to": "ops@example.com"}')


def journal(db: Database) -> CallJournal:
    return CallJournal(db, MemoryStore(db))


def begin(j: CallJournal, wf: str, conv: str = "c", call: ToolCall = CALL) -> int:
    """The attempt's claim (ledger STARTED, audit INITIATED)."""
    return j.begin(Start(workflow_id=wf, chain="run-1", conversation_id=conv, user_id="alice",
                         call=call), rerun_lost=False).attempts


def ending(wf: str, conv: str, seq: int, attempt: int) -> Ending:
    return Ending(workflow_id=wf, chain="run-1", conversation_id=conv, user_id="alice",
                  call=CALL, seq=seq, outcome=CallStatus.COMPLETED, text='{"taskId": "t"}',
                  is_error=False, audit_status=AuditStatus.COMPLETED, attempt=attempt,
                  decision=ApprovalDecision(tool_call_id="call_0", tool_name=CALL.name,
                                            approved=True, reviewer="bob", note="",
                                            decided_at="2026-12-01T00:00:00+00:00"))


def facts(db: Database, wf: str) -> dict[str, int]:
    with db.connect() as conn:
        return {t: fetchone(conn, f"SELECT COUNT(*) AS n FROM {t} WHERE workflow_id = :wf",
                                  {"wf": wf})["n"]  # type: ignore[index]
                for t in ("tool_call_ledger", "tool_execution_log", "approval_decision",
                          "chat_message")}


def test_finish_writes_every_fact_or_none(db: Database) -> None:
    wf, conv = f"wf-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    j = journal(db)
    MemoryStore(db).check_owner(conv, "alice")
    claim = begin(j, wf, conv)
    # The slot is taken by another turn: nothing of this ending may be written.
    MemoryStore(db).put(conv, 5, ChatMessage(role="user", content="x"), "other-turn")
    with pytest.raises(MemoryConflictError):
        j.finish(ending(wf, conv, 5, claim))
    assert facts(db, wf) == {"tool_call_ledger": 1, "tool_execution_log": 1,
                             "approval_decision": 0, "chat_message": 0}
    assert ToolLedger(db).result(wf, "call_0", "run-1") is None  # still STARTED
    assert [r.status for r in AuditLog(db).rows(wf)] == ["INITIATED"]

    j.finish(ending(wf, conv, 6, claim))
    j.landed(ending(wf, conv, 6, None))  # facts recorded again: the same facts
    assert facts(db, wf) == {"tool_call_ledger": 1, "tool_execution_log": 1,
                             "approval_decision": 1, "chat_message": 1}
    [row] = AuditLog(db).rows(wf)
    assert row.execution_id == execution_id(wf, "call_0", "run-1") == f"{wf}/run-1/call_0"
    assert row.status == "COMPLETED" and row.execution_chain == "run-1"
    assert ToolLedger(db).result(wf, "call_0", "run-1") == '{"taskId": "t"}'
    [result] = [m for m in MemoryStore(db).messages(conv) if m.role == "tool"]
    assert result.attributes[attr.OUTCOME] == "completed" and not result.is_error


def test_an_ending_whose_claim_was_taken_records_nothing(db: Database) -> None:
    """Compare-and-set: once a later attempt claimed the call, the earlier
    attempt's ending is refused (CallTakenOver) and rolls back whole."""
    wf, conv = f"wf-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    j = journal(db)
    MemoryStore(db).check_owner(conv, "alice")
    first = begin(j, wf, conv)
    second = j.begin(Start(workflow_id=wf, chain="run-1", conversation_id=conv,
                           user_id="alice", call=CALL), rerun_lost=True)
    assert second.fresh and second.attempts == first + 1
    with pytest.raises(CallTakenOver):
        j.finish(ending(wf, conv, 1, first))
    assert facts(db, wf)["chat_message"] == 0
    j.finish(ending(wf, conv, 1, second.attempts))
    assert ToolLedger(db).status(wf, "call_0", "run-1") == "COMPLETED"


def test_a_failed_attempt_is_one_ending_in_one_transaction(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger lets a retry claim the call and the audit row says why —
    together or not at all (they used to be two transactions of the activity)."""
    wf = f"wf-{uuid.uuid4().hex[:8]}"
    j = journal(db)
    claim = begin(j, wf, call=ToolCall(id="call_0", name="sendMoney"))
    key = CallKey(wf, "run-1", "call_0")

    def broken(*_: object) -> None:
        raise RuntimeError("the audit write failed")

    monkeypatch.setattr(journal_writes, "close_audit", broken)
    with pytest.raises(RuntimeError):
        j.attempt_failed(key, "backend down", claim)
    assert ToolLedger(db).status(wf, "call_0", "run-1") == "STARTED"  # rolled back with it
    monkeypatch.undo()
    j.attempt_failed(key, "backend down", claim)
    assert ToolLedger(db).status(wf, "call_0", "run-1") == "ATTEMPT_FAILED"
    [row] = AuditLog(db).rows(wf)
    assert (row.status, row.error_message) == ("FAILED", "backend down")
    again = j.begin(Start(workflow_id=wf, chain="run-1", conversation_id="c", user_id="alice",
                          call=ToolCall(id="call_0", name="sendMoney")), rerun_lost=False)
    assert again.fresh and again.attempts == claim + 1  # a retry may claim it


def test_with_the_audit_off_the_other_facts_are_still_written(db: Database) -> None:
    """TURNSTILE_AUDIT=off: no audit row, but the ledger, the decision and the
    result message are written as ever."""
    wf, conv = f"wf-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    j = CallJournal(db, MemoryStore(db), audit_enabled=False)
    MemoryStore(db).check_owner(conv, "alice")
    j.finish(ending(wf, conv, 1, begin(j, wf, conv)))
    assert facts(db, wf) == {"tool_call_ledger": 1, "tool_execution_log": 0,
                             "approval_decision": 1, "chat_message": 1}


def test_an_approval_with_edits_keeps_the_reviewers_arguments_masked(db: Database) -> None:
    """The decision row holds the arguments the call ran with, masked as the
    audit masks them (migration 0010), with the audit off too; the inbox's
    "decided" view and `conversation show` read them from there. A plain
    decision holds none."""
    wf, conv = f"wf-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    edited = {"to": "sales@example.com", "subject": "Renewal (final)"}
    j = CallJournal(db, MemoryStore(db), audit_enabled=False)
    MemoryStore(db).check_owner(conv, "alice")
    MemoryStore(db).put(conv, 0, ChatMessage(role="assistant", tool_calls=[CALL]), wf, "run-1")
    plain = ending(wf, conv, 1, begin(j, wf, conv))
    ran = ToolCall(id=CALL.id, name=CALL.name, arguments=json.dumps(edited))
    j.finish(replace(plain, call=ran, model_call=CALL, decision=plain.decision.model_copy(
        update={"arguments": edited})))
    with db.connect() as conn:
        row = fetchone(conn, "SELECT approved, reviewer, edited_arguments FROM "
                             "approval_decision WHERE workflow_id = :wf", {"wf": wf})
    assert row is not None and (row["approved"], row["reviewer"]) == (1, "bob")
    stored = json.loads(row["edited_arguments"])
    assert stored["subject"] == "Renewal (final)"
    assert stored["to"] != "sales@example.com" and stored["to"].endswith("@example.com")
    assert facts(db, wf)["tool_execution_log"] == 0  # no audit row to fall back on
    [decided] = records.recent_decisions(db, query=wf)
    assert decided.verdict == "approved with edits"
    assert decided.edited_text is not None and "Renewal (final)" in decided.edited_text
    assert decided.edits is None
    [entry] = [e for e in read_transcript(db, conv).entries if e.calls]
    decision = entry.calls[0].decision
    assert decision is not None and decision.edited_arguments == stored
    shown = "\n".join(read_transcript(db, conv).lines())
    assert "approved with edits by bob" in shown and "Renewal (final)" in shown
    # A plain approval (another call of another turn): no edits kept.
    other = f"wf-{uuid.uuid4().hex[:8]}"
    j.finish(ending(other, conv, 2, begin(j, other, conv)))
    [plain_decided] = records.recent_decisions(db, query=other)
    assert plain_decided.verdict == "approved" and plain_decided.edited_arguments is None


def test_a_repaired_call_that_never_started_can_never_start(db: Database) -> None:
    """A call its turn left unanswered before any attempt claimed it (it waited
    for an approval when the turn was terminated): the repair says it did not
    run, and claims it, so an attempt that starts late finds it settled."""
    j, wf, conv = journal(db), f"wf-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    MemoryStore(db).append(conv, 0, [
        ChatMessage(role="user", content="mail ops"),
        ChatMessage(role="assistant", content=None, tool_calls=[CALL])], wf, "run-1")
    [repair] = j.repair_orphans(conv, "wf-next")
    assert repair.outcome == CallStatus.FAILED
    [told] = [m for m in MemoryStore(db).messages(conv) if m.role == "tool"]
    assert told.is_error and "did not run" in (told.content or "")
    late = j.begin(Start(workflow_id=wf, chain="run-1", conversation_id=conv, user_id="alice",
                         call=CALL), rerun_lost=False)
    assert not late.fresh and late.result == told.content
    assert [r.status for r in AuditLog(db).rows(wf)] == [AuditStatus.FAILED]
