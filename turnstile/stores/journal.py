"""The call journal: facts about tool calls that span memory, the ledger and
the audit log, each written in one transaction.

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

`finish` records how a call ended — the ledger row, the audit row, the
approval decision and the tool-result message — in one transaction (the
attempt's, if the tool opened it), so a crash can never leave one written
without the others (an audit row left `INITIATED` while the ledger says
`COMPLETED`, a result in memory with no approval row, an effect whose
ledger row still says `STARTED`). `compensated` does the same for an undo:
the compensation's writes, the rewritten result message and the audit row.

`repair_orphans` keeps the promise that every tool call in memory has
exactly one result. A turn that ends without workflow code running —
`temporal workflow terminate`, a `reset` that abandons the base run, a run
that is lost — can leave an assistant message whose tool calls have no
result; real Chat Completions endpoints refuse every later request of that
conversation (400). The next turn's memory load finds such calls and gives
each one a result: the ledger's stored result when the call finished (the
truth), otherwise "interrupted; may or may not have taken effect". The
repair is recorded on the message (`turnstile.repaired`) and in the audit
log, and the rows are written in one transaction with the read that found
them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from turnstile.engine import attributes as attr
from turnstile.engine.contract import ApprovalDecision, AuditStatus, CallStatus
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.stores.audit import AuditLog, execution_id, mask
from turnstile.stores.db import Connection, Database, Transaction
from turnstile.stores.ledger import LedgerEntry, ToolLedger
from turnstile.stores.memory import MemoryStore, now_iso
from turnstile.stores.runs import Writer, claim

log = logging.getLogger(__name__)

ORPHAN_TEXT = (
    "The call to {name} has no result: its turn ended ({reason}) before the call finished "
    "or was decided. It may or may not have taken effect: check its effect before relying "
    "on it or trying again."
)
ORPHAN_REASON = "terminated, reset or lost"


@dataclass(frozen=True)
class Repair:
    """One call given a result by `repair_orphans`."""

    seq: int
    call_id: str
    tool_name: str
    workflow_id: str  # the turn that made the call
    outcome: CallStatus


def open_calls(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[ToolCall],
                                                         int | None]]:
    """Assistant messages with calls left unanswered: (row, calls, seq of the
    next non-tool message or None). The same walk as a Chat Completions
    endpoint's check: a call's result must follow it before the next message."""
    found: list[tuple[dict[str, Any], list[ToolCall], int | None]] = []
    owner: dict[str, Any] | None = None
    open_calls: dict[str, ToolCall] = {}
    for r in rows:
        if r["role"] == "tool":
            open_calls.pop(r.get("tool_call_id") or "", None)
            continue
        if owner is not None and open_calls:
            found.append((owner, list(open_calls.values()), int(r["seq"])))
        owner, open_calls = None, {}
        attrs = json.loads(r["attributes"]) if r.get("attributes") else {}
        if r["role"] == "assistant" and r.get("tool_calls") and not attrs.get(attr.DISCARDED):
            owner = r
            open_calls = {c["id"]: ToolCall.model_validate(c)
                          for c in json.loads(r["tool_calls"])}
    if owner is not None and open_calls:
        found.append((owner, list(open_calls.values()), None))
    return found


@dataclass(frozen=True)
class Ending:
    """How one call ended, as `CallJournal.finish` records it."""

    workflow_id: str
    chain: str
    conversation_id: str
    user_id: str
    call: ToolCall
    seq: int  # the memory slot the workflow assigned to the result
    message: ChatMessage  # the tool-result message
    audit_status: AuditStatus
    audit_error: str | None = None
    decision: ApprovalDecision | None = None  # the approval the call ran under
    ledger: bool = True  # complete the ledger row (False: it is already complete)
    state: dict[str, Any] | None = None
    attempt: int | None = None  # the ledger claim of the attempt (None: not fenced)
    # The result message goes to memory (False: only ledger, audit and decision,
    # for a run a reset replaced, whose memory writes are refused).
    remember: bool = True


@dataclass(frozen=True)
class Start:
    """A tool call an attempt is about to run, as `CallJournal.begin` claims it."""

    workflow_id: str
    chain: str
    conversation_id: str
    user_id: str
    call: ToolCall


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


class CallJournal:
    def __init__(self, db: Database, memory: MemoryStore, ledger: ToolLedger,
                 audit: AuditLog) -> None:
        self.db, self.memory, self.ledger, self.audit = db, memory, ledger, audit
        self.audit_enabled = audit.enabled

    def begin(self, start: Start, *, rerun_lost: bool) -> LedgerEntry:
        """Claim the call (ledger) and open its audit row, in one transaction.
        The audit row is opened only by an attempt that will run the tool."""
        call = start.call
        with self.db.connect() as conn:
            entry = self.ledger.begin(start.workflow_id, call.id, call.name,
                                      rerun_lost=rerun_lost, chain=start.chain, conn=conn)
            if entry.fresh:
                self.audit.started(workflow_id=start.workflow_id, call_id=call.id,
                                   conversation_id=start.conversation_id,
                                   user_id=start.user_id, tool_name=call.name,
                                   arguments=call.arguments, chain=start.chain, conn=conn)
        return entry

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
        if tx is not None and tx.used:
            with tx.use() as conn:
                self._finish(conn, e, writer)
            tx.commit()
            return
        with self.db.connect() as conn:
            self._finish(conn, e, writer)

    def _finish(self, conn: Connection, e: Ending, writer: Writer | None = None) -> None:
        if writer is not None and e.remember:
            claim(conn, e.conversation_id, writer, range(e.seq, e.seq + 1))
        m = e.message
        outcome = CallStatus(m.attributes.get(attr.OUTCOME, CallStatus.COMPLETED.value))
        if e.ledger:
            self.ledger.complete(e.workflow_id, e.call.id, m.content or "", m.is_error,
                                 outcome, e.state, e.chain, conn=conn, attempt=e.attempt)
        if e.decision is not None:
            d = e.decision
            self.audit.decision(workflow_id=e.workflow_id, tool_name=e.call.name,
                                tool_call_id=e.call.id, approved=d.approved,
                                reviewer=d.reviewer, note=d.note, decided_at=d.decided_at,
                                chain=e.chain, conn=conn)
        opened = conn.fetchone(
            "SELECT 1 AS x FROM tool_execution_log WHERE execution_id = :k",
            {"k": execution_id(e.workflow_id, e.call.id, e.chain)})
        if opened is None:
            self.audit.settled(workflow_id=e.workflow_id, call_id=e.call.id,
                               conversation_id=e.conversation_id, user_id=e.user_id,
                               tool_name=e.call.name, arguments=e.call.arguments,
                               status=e.audit_status, error=e.audit_error or "",
                               chain=e.chain, conn=conn)
        else:
            self.audit.finished(workflow_id=e.workflow_id, call_id=e.call.id,
                                status=e.audit_status, error=e.audit_error, chain=e.chain,
                                conn=conn)
        if e.remember:
            self.memory.append_in(conn, e.conversation_id, e.seq, [m], e.workflow_id,
                                  e.chain or None,
                                  run_id=writer.run_id if writer is not None else None)

    def attempt_failed(self, workflow_id: str, chain: str, call_id: str, error: str,
                       attempt: int) -> None:
        """An attempt that ended without a result (the tool raised): the ledger
        lets a retry claim the call again and the audit row says why, in one
        transaction. Only while `attempt` still holds the claim."""
        with self.db.connect() as conn:
            self.ledger.attempt_failed(workflow_id, call_id, error, chain, attempt, conn=conn)
            self.audit.finished(workflow_id=workflow_id, call_id=call_id,
                                status=AuditStatus.FAILED, error=error, chain=chain, conn=conn)

    def compensated(self, u: Undone, tx: Transaction | None = None) -> None:
        """What memory and the audit log say after an undo, in one transaction
        with the undo's own writes (`tx`, then committed) if it made any."""
        if tx is not None and tx.used:
            with tx.use() as conn:
                self._compensated(conn, u)
            tx.commit()
            return
        with self.db.connect() as conn:
            self._compensated(conn, u)

    def rolled_back(self, conversation_id: str, call_id: str, workflow_id: str,
                    chain: str) -> str | None:
        """What memory says of a call of this turn that a compensation undid
        and recorded (None: not undone yet)."""
        with self.db.connect() as conn:
            rows = conn.fetchall(
                "SELECT content, attributes FROM chat_message WHERE conversation_id = :c "
                "AND tool_call_id = :call AND role = 'tool' AND workflow_id = :wf "
                "AND COALESCE(execution_chain, '') = :chain",
                {"c": conversation_id, "call": call_id, "wf": workflow_id, "chain": chain})
        for r in rows:
            if r["attributes"] and json.loads(r["attributes"]).get(attr.ROLLED_BACK):
                return str(r["content"] or "")
        return None

    def _compensated(self, conn: Connection, u: Undone) -> None:
        self.memory.rewrite_tool_result(u.conversation_id, u.call_id, u.text, u.attributes,
                                        workflow_id=u.workflow_id, chain=u.chain, conn=conn)
        self.audit.finished(workflow_id=u.workflow_id, call_id=u.call_id,
                            status=u.audit_status, error=u.audit_error, chain=u.chain,
                            conn=conn)

    def repair_orphans(self, conversation_id: str, repaired_by: str,
                       conn: Connection | None = None) -> list[Repair]:
        """Give every unanswered tool call of the conversation a result (see
        the module's doc), in `conn`'s transaction when given. Idempotent: a
        repaired call is answered."""
        repairs: list[Repair] = []
        with self.db.joined(conn) as conn:
            # Only what lies after the watermark: every call before it is answered.
            mark = conn.fetchone("SELECT answered_through FROM conversation "
                                 "WHERE conversation_id = :c", {"c": conversation_id})
            through = mark["answered_through"] if mark else None
            rows = conn.fetchall(
                "SELECT seq, role, tool_calls, tool_call_id, attributes, workflow_id, "
                "execution_chain, run_id, conversation_id FROM chat_message "
                "WHERE conversation_id = :c AND seq > :w ORDER BY seq",
                {"c": conversation_id, "w": -1 if through is None else int(through)})
            taken = {int(r["seq"]) for r in rows}
            stuck: int | None = None  # the first call left unanswered (no free slot)
            for owner, calls, next_seq in open_calls(rows):
                slot = int(owner["seq"])
                for call in calls:
                    slot += 1
                    while slot in taken:
                        slot += 1
                    if next_seq is not None and slot >= next_seq:
                        log.error("conversation %s: no free slot for the result of call %s "
                                  "(seq %s); left unanswered", conversation_id, call.id,
                                  owner["seq"])
                        stuck = int(owner["seq"]) if stuck is None else stuck
                        break
                    taken.add(slot)
                    repairs.append(self._answer(conn, conversation_id, slot, owner, call,
                                                repaired_by))
            if taken:  # every call through the newest slot read is answered now
                mark_at = max(taken) if stuck is None else stuck - 1
                conn.execute("UPDATE conversation SET answered_through = :w "
                             "WHERE conversation_id = :c", {"c": conversation_id, "w": mark_at})
        for r in repairs:
            log.warning("conversation %s: call %s (%s) of turn %s had no result; recorded "
                        "as %s at seq %d", conversation_id, r.call_id, r.tool_name,
                        r.workflow_id, r.outcome.value, r.seq)
        return repairs

    def _answer(self, conn: Connection, conversation_id: str, seq: int,
                owner: dict[str, Any], call: ToolCall, repaired_by: str) -> Repair:
        wf_id = owner.get("workflow_id") or ""
        chain = owner.get("execution_chain") or ""
        done = conn.fetchone(
            "SELECT result, is_error, outcome, state FROM tool_call_ledger "
            "WHERE workflow_id = :wf AND execution_chain = :chain AND tool_call_id = :call "
            "AND status = 'COMPLETED'", {"wf": wf_id, "chain": chain, "call": call.id})
        marker = {"by": repaired_by, "reason": ORPHAN_REASON,
                  "source": "ledger" if done else "none"}
        if done is not None:  # the call finished; only its memory write was lost
            outcome = CallStatus(done["outcome"] or (
                CallStatus.FAILED if done["is_error"] else CallStatus.COMPLETED))
            text, is_error = done["result"] or "", bool(done["is_error"])
        else:
            outcome, is_error = CallStatus.INTERRUPTED, True
            text = ORPHAN_TEXT.format(name=call.name, reason=ORPHAN_REASON)
        message = ChatMessage(role="tool", content=text, tool_call_id=call.id,
                              is_error=is_error,
                              attributes={attr.TOOL_NAME: call.name, attr.OUTCOME: outcome.value,
                                          attr.WORKFLOW_ID: wf_id, attr.REPAIRED: marker})
        if done is not None and done["state"]:
            message.attributes[attr.STATE] = json.loads(done["state"])
        # Written for the run that made the call: a reset run that replaces that
        # run supersedes the repair with the rest of its rows.
        self.memory.append_in(conn, conversation_id, seq, [message], wf_id, chain or None,
                              run_id=owner.get("run_id"))
        if self.audit_enabled and done is None:
            self._audit_interrupted(conn, conversation_id, owner, call, chain, repaired_by)
        return Repair(seq=seq, call_id=call.id, tool_name=call.name, workflow_id=wf_id,
                      outcome=outcome)

    @staticmethod
    def _audit_interrupted(conn: Connection, conversation_id: str, owner: dict[str, Any],
                           call: ToolCall, chain: str, repaired_by: str) -> None:
        """Close the call's audit row (open if the tool was running) or add one."""
        wf_id = owner.get("workflow_id") or ""
        key = execution_id(wf_id, call.id, chain)
        error = (f"interrupted; effect unknown: turn {wf_id} ended without a result "
                 f"({ORPHAN_REASON}); repaired by {repaired_by}")
        row = conn.fetchone("SELECT status FROM tool_execution_log WHERE execution_id = :k",
                            {"k": key})
        if row is not None:
            if row["status"] == AuditStatus.INITIATED.value:
                conn.execute("UPDATE tool_execution_log SET status = :s, end_time = :now, "
                             "error_message = :e WHERE execution_id = :k",
                             {"s": AuditStatus.FAILED.value, "now": now_iso(), "e": error,
                              "k": key})
            return
        user = conn.fetchone("SELECT user_id FROM conversation WHERE conversation_id = :c",
                             {"c": conversation_id})
        now = now_iso()
        conn.execute(
            "INSERT INTO tool_execution_log (execution_id, workflow_id, conversation_id, "
            "user_id, tool_name, input_params, start_time, end_time, status, error_message, "
            "execution_chain) VALUES (:k, :wf, :c, :u, :t, :p, :now, :now, :s, :e, :chain)",
            {"k": key, "wf": wf_id, "c": conversation_id,
             "u": user["user_id"] if user else "", "t": call.name,
             "p": mask(call.arguments)[:16_384], "now": now, "s": AuditStatus.FAILED.value,
             "e": error, "chain": chain or None})
