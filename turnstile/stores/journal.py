"""The call journal: facts about tool calls that span memory, the ledger and
the audit log, each written in one transaction.

`finish` records how a call ended — the ledger row, the audit row, the
approval decision and the tool-result message — in one transaction, so a
crash can never leave one written without the others (an audit row left
`INITIATED` while the ledger says `COMPLETED`, a result in memory with no
approval row).

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
from turnstile.stores.db import Connection, Database
from turnstile.stores.memory import MemoryStore, ToolLedger, now_iso

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


class CallJournal:
    def __init__(self, db: Database, memory: MemoryStore, ledger: ToolLedger,
                 audit: AuditLog) -> None:
        self.db, self.memory, self.ledger, self.audit = db, memory, ledger, audit
        self.audit_enabled = audit.enabled

    def finish(self, e: Ending) -> None:
        """Ledger, audit, decision and result message of one call, in one
        transaction. Idempotent: a retried attempt rewrites the same facts."""
        m = e.message
        outcome = CallStatus(m.attributes.get(attr.OUTCOME, CallStatus.COMPLETED.value))
        with self.db.connect() as conn:
            if e.ledger:
                self.ledger.complete(e.workflow_id, e.call.id, m.content or "", m.is_error,
                                     outcome, e.state, e.chain, conn=conn)
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
            self.memory.append_in(conn, e.conversation_id, e.seq, [m], e.workflow_id,
                                  e.chain or None)

    def repair_orphans(self, conversation_id: str, repaired_by: str) -> list[Repair]:
        """Give every unanswered tool call of the conversation a result (see
        the module's doc). Idempotent: a repaired call is answered."""
        repairs: list[Repair] = []
        with self.db.connect() as conn:
            rows = conn.fetchall(
                "SELECT seq, role, tool_calls, tool_call_id, attributes, workflow_id, "
                "execution_chain, conversation_id FROM chat_message "
                "WHERE conversation_id = :c ORDER BY seq", {"c": conversation_id})
            taken = {int(r["seq"]) for r in rows}
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
                        break
                    taken.add(slot)
                    repairs.append(self._answer(conn, conversation_id, slot, owner, call,
                                                repaired_by))
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
        self.memory.append_in(conn, conversation_id, seq, [message], wf_id, chain or None)
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
