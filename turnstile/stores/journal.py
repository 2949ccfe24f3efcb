"""The call journal: the one writer of the facts about tool calls — the
ledger (`tool_call_ledger`), the audit log (`tool_execution_log`) and the
approval decisions (`approval_decision`) — each ending of a call written in
one transaction, with the call's result message in memory where the ending
has one. Its statements are in journal_writes; journal_repair gives calls
that never ended a result. No other module writes those tables
(tests/test_one_writer.py).

`begin` claims a call for an attempt: the ledger row (compare-and-set) and
the audit row `INITIATED`, in one transaction.

`transaction()` is the journal's transaction of one attempt, opened only if
the tool asks for it (`ToolContext.transaction()`): a database-backed tool
writes its effect there, and `finish` then records how the call ended on the
same connection before the one commit. The effect and its record commit
together or not at all: a crash before the commit leaves neither (a retry
finds the ledger row `STARTED` and nothing in the world, so running the tool
again is safe, even for a tool that is not idempotent: ToolSpec
`transactional`), a crash after it leaves both (the retry finds `COMPLETED`
and returns the stored result). The ledger claim (`attempts`) fences it: an
attempt whose call a later attempt has claimed since rolls back instead.

The endings, each one transaction:
- `finish`: the ledger row, the audit row, the approval decision and the
  tool-result message (the attempt's transaction, if the tool opened it), so
  a crash can never leave one written without the others;
- `landed`: the same but the message, for an effect that landed where memory
  is not the attempt's to write (its run was replaced by a reset, its turn
  was cancelled while the tool's thread ran);
- `attempt_failed`: the ledger lets a retry claim the call, the audit row says why;
- `compensated`: an undo's own writes, the rewritten result message and the audit row;
- `settled`: the calls the workflow settled without running them (audit rows,
  decisions), in the transaction of the messages it wrote;
- `settle_own_superseded` / `settle_others_superseded`: what became of the
  calls of a run a reset replaced (turnstile.stores.superseded), with their
  audit rows;
- `repair_orphans` (journal_repair): a result for every call in memory that
  has none.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import sqlalchemy as sa

from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import AuditEntry
from turnstile.engine.approvals import changed_fields, recorded_edits
from turnstile.engine.contract import ApprovalDecision, AuditStatus, CallStatus
from turnstile.engine.errors import CallTakenOver
from turnstile.engine.flow import Provenance
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.stores import journal_writes as w, ledger, superseded
from turnstile.stores.audit import mask
from turnstile.stores.call_key import CallKey
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.journal_repair import Repair, open_calls, owner_of, repair_orphans
from turnstile.stores.ledger import LedgerEntry, LedgerStatus
from turnstile.stores.memory import MemoryStore, chat_message, load_attributes
from turnstile.stores.runs import Writer, claim
from turnstile.stores.superseded import Effect, SupersededCall
from turnstile.stores.transaction import Transaction

__all__ = ["CallJournal", "Ending", "Repair", "Start", "Undone", "open_calls"]


@dataclass(frozen=True)
class Start:
    """A tool call an attempt is about to run, as `CallJournal.begin` claims it."""

    workflow_id: str
    chain: str
    conversation_id: str
    user_id: str
    call: ToolCall
    approval_reason: str | None = None  # why it waited (a condition's words), for the audit row
    provenance: Provenance | None = None  # where the sensitive arguments came from (audit row)


@dataclass(frozen=True)
class Ending:
    """How one call ended, as the journal records it."""

    workflow_id: str
    chain: str
    conversation_id: str
    user_id: str
    call: ToolCall
    seq: int  # the memory slot the workflow assigned to the result
    outcome: CallStatus
    text: str  # the result, as the model reads it
    is_error: bool
    audit_status: AuditStatus
    audit_error: str | None = None
    decision: ApprovalDecision | None = None  # the approval the call ran under
    state: dict[str, Any] | None = None  # cross-round state the tool returned
    # The ledger claim this ending completes (`begin`'s `attempts`). None: the
    # ledger row is not this attempt's to write (the call was never claimed —
    # an unknown tool, invalid arguments — or an earlier attempt completed it).
    attempt: int | None = None
    # Approved with edits: the model's own call (`call` ran with the
    # reviewer's arguments). Memory's result then carries the edit beside the
    # tool's result (attribute `turnstile.edited`), and the audit log holds
    # an APPROVED_WITH_EDITS row with both versions.
    model_call: ToolCall | None = None
    approval_reason: str | None = None  # why it waited (a condition's words), for the audit row
    provenance: Provenance | None = None  # where the sensitive arguments came from (audit row)

    @property
    def key(self) -> CallKey:
        return CallKey(self.workflow_id, self.chain, self.call.id)

    def message(self) -> ChatMessage:
        """The tool-result message memory keeps."""
        attributes: dict[str, Any] = {attr.TOOL_NAME: self.call.name,
                                      attr.OUTCOME: self.outcome.value,
                                      attr.WORKFLOW_ID: self.workflow_id}
        if self.state:
            attributes[attr.STATE] = self.state
        if self.model_call is not None and self.decision is not None:
            # The tool's result stays as the tool returned it; the edit rides
            # beside it (a wire model reads it as a note of its own).
            after = _parsed(self.call)
            if isinstance(after, dict):
                attributes[attr.EDITED] = recorded_edits(
                    self.decision.reviewer, _parsed(self.model_call), after)
        return ChatMessage(role="tool", content=self.text, tool_call_id=self.call.id,
                           is_error=self.is_error, attributes=attributes)


@dataclass(frozen=True)
class Undone:
    """How one compensation ended, as `CallJournal.compensated` records it."""

    workflow_id: str
    chain: str
    conversation_id: str
    call_id: str
    text: str  # what memory now says about the call
    attributes: dict[str, Any]  # added to the result message's attributes
    audit_status: AuditStatus
    audit_error: str


class _Result(NamedTuple):
    """A tool result's text and attributes, as stored."""

    content: str | None
    attributes: str | None


def _parsed(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments


def _execution(key: CallKey, conversation_id: str, user_id: str, call: ToolCall,
               execution_id: str | None = None,
               approval_reason: str | None = None,
               provenance: Provenance | None = None) -> w.Execution:
    return w.Execution(execution_id=execution_id or key.execution_id,
                       workflow_id=key.workflow_id, chain=key.chain,
                       conversation_id=conversation_id, user_id=user_id, tool_name=call.name,
                       arguments=call.arguments, approval_reason=approval_reason,
                       provenance=provenance)


class CallJournal:
    """The one writer of the call facts (see the module's doc)."""

    def __init__(self, db: Database, memory: MemoryStore, audit_enabled: bool = True) -> None:
        self.db, self.memory = db, memory
        self.audit_enabled = audit_enabled  # TURNSTILE_AUDIT: decisions are kept either way

    # --- an attempt ----------------------------------------------------------

    def begin(self, start: Start, *, rerun_lost: bool) -> LedgerEntry:
        """Claim the call (ledger, compare-and-set) and open its audit row, in
        one transaction. The audit row is opened only by an attempt that will
        run the tool. `rerun_lost`: an attempt that vanished mid-run may be
        run again (the tool is idempotent or transactional). `attempts` of
        the entry is the claim: an ending with it changes the ledger only
        while no later attempt has claimed the call since."""
        key = CallKey(start.workflow_id, start.chain, start.call.id)
        with self.db.connect() as conn:
            entry = self._claim(conn, key, start.call.name, rerun_lost)
            if entry.fresh and self.audit_enabled:
                w.open_audit(conn, _execution(key, start.conversation_id, start.user_id,
                                              start.call,
                                              approval_reason=start.approval_reason,
                                              provenance=start.provenance))
        return entry

    @staticmethod
    def _claim(conn: Connection, key: CallKey, tool_name: str, rerun_lost: bool) -> LedgerEntry:
        if w.claim_first(conn, key, tool_name):
            return LedgerEntry(status=LedgerStatus.STARTED, fresh=True)
        for _ in range(3):  # another attempt may change the row between read and claim
            row = ledger.read(conn, key)
            assert row is not None
            if row.status is LedgerStatus.COMPLETED:
                return LedgerEntry(status=row.status, fresh=False, result=row.result,
                                   is_error=row.is_error, attempts=row.attempts,
                                   outcome=row.outcome, state=row.state)
            if row.status is LedgerStatus.ATTEMPT_FAILED or rerun_lost:
                if w.claim_again(conn, key, row):
                    return LedgerEntry(status=LedgerStatus.STARTED, fresh=True,
                                       attempts=row.attempts + 1)
                continue
            # STARTED and never finished: an earlier attempt was lost mid-run.
            return LedgerEntry(status=row.status, fresh=False, attempts=row.attempts)
        raise CallTakenOver(f"tool call {key.call_id} of {key.workflow_id}: its ledger row "
                            "keeps changing (another attempt of the call is running)")

    def transaction(self) -> Transaction:
        """The journal's transaction of one attempt, opened on first use."""
        return Transaction(self.db)

    def finish(self, e: Ending, tx: Transaction | None = None,
               writer: Writer | None = None) -> None:
        """Ledger, audit, decision and result message of one call, in one
        transaction: `tx` (then committed) when the tool wrote its effect
        there — never a new one then: a `tx` that has ended raises
        TransactionEnded, and nothing is recorded without the effect — else
        a new one. Idempotent: a retried attempt rewrites the same facts.
        `writer`: the run writing, which claims the result's slot first
        (turnstile.stores.runs); its RunUnconfirmed leaves `tx` open and
        uncommitted, so the confirmed claim records in the same transaction."""
        def record(conn: Connection) -> None:
            if writer is not None:
                claim(conn, e.conversation_id, writer, range(e.seq, e.seq + 1))
            self._ended(conn, e)
            self.memory.append_in(conn, e.conversation_id, e.seq, [e.message()],
                                  e.workflow_id, e.chain or None,
                                  run_id=writer.run_id if writer is not None else None)
        self._in(tx, record)

    def landed(self, e: Ending, tx: Transaction | None = None) -> None:
        """Ledger, audit and decision of a call whose result message is not
        this attempt's to write: its run was replaced by a reset (memory
        refuses its writes; the reset run reuses the ledger's result), or
        its turn was cancelled while the tool's thread ran (the cancel path
        writes memory, then the undo of what the ledger says landed)."""
        self._in(tx, lambda conn: self._ended(conn, e))

    def _in(self, tx: Transaction | None, record: Callable[[Connection], None]) -> None:
        """`record(conn)` in `tx` (then committed) if the tool used it, else
        in a transaction of its own."""
        if tx is not None and tx.used:
            with tx.use() as conn:
                record(conn)
            tx.commit()
            return
        with self.db.connect() as conn:
            record(conn)

    def _ended(self, conn: Connection, e: Ending) -> None:
        key = e.key
        if e.attempt is not None and not w.complete(
                conn, key, e.attempt, outcome=e.outcome, result=e.text, is_error=e.is_error,
                state=e.state):
            raise CallTakenOver(f"tool call {key.call_id} of {key.workflow_id}: a later "
                                f"attempt claimed it from attempt {e.attempt}")
        if e.decision is not None:
            w.record_decision(conn, key, e.call.name, e.decision)
        if not self.audit_enabled:
            return
        if e.model_call is not None and e.decision is not None:
            self._audit_edits(conn, e, e.model_call, e.decision)
        # The attempt's row ended, or (none was opened: a call settled
        # without running) one complete row written: one statement when it ran.
        if not w.close_audit(conn, key.execution_id, e.audit_status, e.audit_error):
            w.settle_audit(conn, _execution(key, e.conversation_id, e.user_id, e.call,
                                            approval_reason=e.approval_reason,
                                            provenance=e.provenance),
                           e.audit_status, e.audit_error or "")

    @staticmethod
    def _audit_edits(conn: Connection, e: Ending, model_call: ToolCall,
                     decision: ApprovalDecision) -> None:
        """The row of an approval with edits: who edited, the model's arguments
        and the reviewer's (masked as every audit row), what changed."""
        before, after = _parsed(model_call), _parsed(e.call)
        changed = changed_fields(before, after) if isinstance(after, dict) else []
        record = ToolCall(id=f"{e.call.id}/edited", name=e.call.name, arguments=json.dumps(
            {"edited_by": decision.reviewer, "model_arguments": before,
             "reviewer_arguments": after, "changed": changed}, ensure_ascii=False))
        key = CallKey(e.workflow_id, e.chain, record.id)
        w.add_audit(conn, _execution(key, e.conversation_id, e.user_id, record),
                    AuditStatus.APPROVED_WITH_EDITS,
                    mask(f"approved with edits by {decision.reviewer}: "
                           f"{', '.join(changed) or 'no field'} changed"))

    def attempt_failed(self, key: CallKey, error: str, attempt: int) -> None:
        """An attempt that ended without a result (the tool raised): the ledger
        lets a retry claim the call again and the audit row says why, in one
        transaction. Only while `attempt` still holds the claim."""
        with self.db.connect() as conn:
            w.release(conn, key, attempt, error)
            if self.audit_enabled:
                w.close_audit(conn, key.execution_id, AuditStatus.FAILED, error)

    # --- after the attempts ----------------------------------------------------

    def compensated(self, u: Undone, tx: Transaction | None = None) -> None:
        """What memory and the audit log say after an undo, in one transaction
        with the undo's own writes (`tx`, then committed) if it made any."""
        def record(conn: Connection) -> None:
            self.memory.rewrite_tool_result(u.conversation_id, u.call_id, u.text,
                                            u.attributes, workflow_id=u.workflow_id,
                                            chain=u.chain, conn=conn)
            if self.audit_enabled:
                w.close_audit(conn, CallKey(u.workflow_id, u.chain, u.call_id).execution_id,
                              u.audit_status, u.audit_error)
        self._in(tx, record)

    def rolled_back(self, conversation_id: str, call_id: str, workflow_id: str,
                    chain: str) -> str | None:
        """What memory says of a call of this turn that a compensation undid
        and recorded (None: not undone yet)."""
        m = chat_message.c
        stmt = sa.select(m.content, m.attributes).where(
            m.conversation_id == conversation_id, m.tool_call_id == call_id, m.role == "tool",
            m.workflow_id == workflow_id, sa.func.coalesce(m.execution_chain, "") == chain)
        with self.db.connect() as conn:
            rows = conn.rows(stmt, _Result)
        for r in rows:
            if load_attributes(r.attributes).get(attr.ROLLED_BACK):
                return r.content or ""
        return None

    def settled(self, conn: Connection, workflow_id: str, chain: str, conversation_id: str,
                user_id: str, entries: list[AuditEntry],
                decisions: list[ApprovalDecision]) -> None:
        """Calls the turn's workflow settled without running them (unknown
        tool, rejection, a breaker, retries exhausted) and the decisions it
        took, in `conn`'s transaction (with the messages it wrote)."""
        for d in decisions:
            w.record_decision(conn, CallKey(workflow_id, chain, d.tool_call_id), d.tool_name, d)
        if not self.audit_enabled:
            return
        for a in entries:
            call = ToolCall(id=a.call_id, name=a.tool_name, arguments=a.arguments)
            w.settle_audit(conn, _execution(CallKey(workflow_id, chain, a.call_id),
                                            conversation_id, user_id, call,
                                            approval_reason=a.approval_reason,
                                            provenance=a.provenance),
                           a.status, a.error)

    # --- calls of runs a reset replaced --------------------------------------

    def settle_own_superseded(self, conn: Connection, conversation_id: str,
                              writer: Writer) -> list[tuple[SupersededCall, Effect]]:
        """As the run `writer` ends: what became of its turn's superseded calls."""
        return self._settle(conn, writer.run_id, superseded.unsettled_of_turn(
            conn, conversation_id, writer.workflow_id, writer.chain))

    def settle_others_superseded(self, conn: Connection, conversation_id: str,
                                 workflow_id: str,
                                 chain: str) -> list[tuple[SupersededCall, Effect]]:
        """As the turn (`workflow_id`, `chain`) loads memory holding the lock:
        what became of every other turn's superseded calls (their runs have ended)."""
        return self._settle(conn, workflow_id, superseded.unsettled_of_other_turns(
            conn, conversation_id, workflow_id, chain))

    def _settle(self, conn: Connection, by: str,
                rows: list[superseded.SupersededRow]) -> list[tuple[SupersededCall, Effect]]:
        settled = superseded.settle(conn, rows, by)
        if self.audit_enabled:
            for sc, effect in settled:
                self._audit_superseded(conn, sc, effect, by)
        return settled

    @staticmethod
    def _audit_superseded(conn: Connection, sc: SupersededCall, effect: Effect,
                          by: str) -> None:
        """Close the call's audit row if it was left open; an effect that
        remains (or may) gets a SUPERSEDED row of its own."""
        if effect is Effect.MADE_AGAIN:
            return  # the reset run's execution wrote the call's audit row
        w.close_open_audit(conn, sc.key, f"superseded by reset run {sc.superseded_by}: "
                                         f"{superseded.DETAIL[effect]}")
        if effect is Effect.NONE:
            return
        key = CallKey(sc.workflow_id, sc.chain, sc.call.id)
        call = sc.call.model_copy(update={"name": sc.call.name or "(unknown)"})
        w.add_audit(conn, _execution(key, sc.conversation_id, owner_of(conn, sc.conversation_id),
                                     call, f"{sc.key}/superseded"),
                    AuditStatus.SUPERSEDED,
                    f"{superseded.DETAIL[effect]} (turn {sc.workflow_id} was reset; run "
                    f"{sc.superseded_by} took its place; recorded by {by})")

    def repair_orphans(self, conversation_id: str, repaired_by: str,
                       conn: Connection | None = None) -> list[Repair]:
        """Give every unanswered tool call of the conversation a result
        (journal_repair), in `conn`'s transaction when given."""
        with self.db.joined(conn) as conn:
            return repair_orphans(conn, self.memory, self.audit_enabled, conversation_id,
                                  repaired_by)

