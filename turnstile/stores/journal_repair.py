"""The call journal's repair: every tool call in memory has exactly one result.

A turn that ends without workflow code running — `temporal workflow
terminate`, a `reset` that abandons the base run, a run that is lost — can
leave an assistant message whose tool calls have no result; real Chat
Completions endpoints refuse every later request of that conversation (400).
The next turn's memory load finds such calls and gives each one a result: the
ledger's stored result when the call finished (the truth), otherwise
"interrupted; may or may not have taken effect". The repair is recorded on
the message (`turnstile.repaired`) and in the audit log (journal_writes), and
the rows are written in one transaction with the read that found them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from turnstile.engine import attributes as attr
from turnstile.engine.contract import AuditStatus, CallStatus
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.stores import journal_writes as w, ledger
from turnstile.stores.call_key import CallKey
from turnstile.stores.connection import Connection
from turnstile.stores.damage import check_row
from turnstile.stores.ledger import LedgerStatus
from turnstile.stores.memory import (
    MemoryStore,
    MessageRow,
    chat_message,
    conversation,
    load_attributes,
    mark_answered_through,
)
from turnstile.stores.prebuilt import prebuilt

log = logging.getLogger("turnstile.stores.journal")

_m, _cv = chat_message.c, conversation.c
# What the repair reads: only what lies after the conversation's watermark
# (every call before it is answered), every column but content and
# created_at (MessageRow's defaults); the watermark read in the same
# statement. Built once, the conversation bound at execution.
_AFTER_WATERMARK = prebuilt(
    sa.select(_m.conversation_id, _m.seq, _m.role, _m.tool_calls, _m.tool_call_id,
              _m.attributes, _m.workflow_id, _m.execution_chain, _m.run_id)
    .where(_m.conversation_id == sa.bindparam("conv"),
           _m.seq > sa.func.coalesce(
               sa.select(_cv.answered_through).where(_cv.conversation_id == sa.bindparam("conv"))
               .scalar_subquery(), -1))
    .order_by(_m.seq))

ORPHAN_TEXT = (
    "The call to {name} has no result: its turn ended ({reason}) before the call finished "
    "or was decided. It may or may not have taken effect: check its effect before relying "
    "on it or trying again."
)
ORPHAN_REASON = "terminated, reset or lost"
# A call no attempt had claimed: the repair claims it itself (a COMPLETED
# ledger row), so an attempt that starts late finds it settled and never runs it.
NOT_RUN_TEXT = (
    "The call to {name} did not run: its turn ended ({reason}) before the call started, "
    "and it will not run now."
)


@dataclass(frozen=True)
class Repair:
    """One call given a result by `repair_orphans`."""

    seq: int
    call_id: str
    tool_name: str
    workflow_id: str  # the turn that made the call
    outcome: CallStatus


def open_calls(rows: Sequence[MessageRow]
               ) -> list[tuple[MessageRow, list[ToolCall], int | None]]:
    """Assistant messages (chat_message rows, by seq) with calls left
    unanswered: (row, calls, seq of the next non-tool message or None). The
    same walk as a Chat Completions endpoint's check: a call's result must
    follow it before the next message."""
    found: list[tuple[MessageRow, list[ToolCall], int | None]] = []
    owner: MessageRow | None = None
    waiting: dict[str, ToolCall] = {}
    for r in rows:
        if r.role == "tool":
            waiting.pop(r.tool_call_id or "", None)
            continue
        if owner is not None and waiting:
            found.append((owner, list(waiting.values()), int(r.seq)))
        owner, waiting = None, {}
        if (r.role == "assistant" and r.tool_calls
                and not load_attributes(r.attributes).get(attr.DISCARDED)):
            owner = r
            waiting = {c["id"]: ToolCall.model_validate(c) for c in json.loads(r.tool_calls)}
    if owner is not None and waiting:
        found.append((owner, list(waiting.values()), None))
    return found


def repair_orphans(conn: Connection, memory: MemoryStore, audit: bool, conversation_id: str,
                   repaired_by: str) -> list[Repair]:
    """Give every unanswered tool call of the conversation a result, in
    `conn`'s transaction (`audit`: TURNSTILE_AUDIT). Idempotent: a repaired
    call is answered."""
    repairs: list[Repair] = []
    rows = conn.rows(_AFTER_WATERMARK, MessageRow, {"conv": conversation_id})
    for row in rows:  # a damaged row ends the turn, named (turnstile.stores.damage)
        check_row(row._asdict())
    taken = {int(r.seq) for r in rows}
    stuck: int | None = None  # the first call left unanswered (no free slot)
    for owner, calls, next_seq in open_calls(rows):
        slot = int(owner.seq)
        for call in calls:
            slot += 1
            while slot in taken:
                slot += 1
            if next_seq is not None and slot >= next_seq:
                log.error("conversation %s: no free slot for the result of call %s "
                          "(seq %s); left unanswered", conversation_id, call.id, owner.seq)
                stuck = int(owner.seq) if stuck is None else stuck
                break
            taken.add(slot)
            repairs.append(_answer(conn, memory, audit, conversation_id, slot, owner, call,
                                   repaired_by))
    if taken:  # every call through the newest slot read is answered now
        mark_at = max(taken) if stuck is None else stuck - 1
        mark_answered_through(conn, conversation_id, mark_at)
    for r in repairs:
        log.warning("conversation %s: call %s (%s) of turn %s had no result; recorded "
                    "as %s at seq %d", conversation_id, r.call_id, r.tool_name,
                    r.workflow_id, r.outcome.value, r.seq)
    return repairs


def _answer(conn: Connection, memory: MemoryStore, audit: bool, conversation_id: str,
            seq: int, owner: MessageRow, call: ToolCall, repaired_by: str) -> Repair:
    wf_id = owner.workflow_id or ""
    key = CallKey(wf_id, owner.execution_chain or "", call.id)
    row = ledger.read(conn, key)
    done = row if row is not None and row.status is LedgerStatus.COMPLETED else None
    marker = {"by": repaired_by, "reason": ORPHAN_REASON,
              "source": "ledger" if done else "none"}
    fenced = row is None and w.claim_first(conn, key, call.name)
    if done is not None:  # the call finished; only its memory write was lost
        outcome, text, is_error = done.reported, done.result or "", done.is_error
    elif fenced:  # never claimed, and now no attempt can claim it
        outcome, is_error = CallStatus.FAILED, True
        text = NOT_RUN_TEXT.format(name=call.name, reason=ORPHAN_REASON)
        w.complete(conn, key, 1, outcome=outcome, result=text, is_error=True, state=None)
    else:
        outcome, is_error = CallStatus.INTERRUPTED, True
        text = ORPHAN_TEXT.format(name=call.name, reason=ORPHAN_REASON)
    message = ChatMessage(role="tool", content=text, tool_call_id=call.id, is_error=is_error,
                          attributes={attr.TOOL_NAME: call.name, attr.OUTCOME: outcome.value,
                                      attr.WORKFLOW_ID: wf_id, attr.REPAIRED: marker})
    if done is not None and done.state:
        message.attributes[attr.STATE] = done.state
    # Written for the run that made the call: a reset run that replaces that
    # run supersedes the repair with the rest of its rows.
    memory.append_in(conn, conversation_id, seq, [message], wf_id, key.chain or None,
                     run_id=owner.run_id)
    if audit and done is None:
        _audit_ended(conn, conversation_id, key, call, repaired_by, ran=not fenced)
    return Repair(seq=seq, call_id=call.id, tool_name=call.name, workflow_id=wf_id,
                  outcome=outcome)


def _audit_ended(conn: Connection, conversation_id: str, key: CallKey, call: ToolCall,
                 repaired_by: str, *, ran: bool) -> None:
    """Close the call's audit row (open if the tool was running) or add one."""
    what = "interrupted; effect unknown" if ran else "not run"
    error = (f"{what}: turn {key.workflow_id} ended without a result "
             f"({ORPHAN_REASON}); repaired by {repaired_by}")
    if w.audit_opened(conn, key.execution_id) is not None:
        w.close_open_audit(conn, key.execution_id, error)
        return
    w.add_audit(conn, w.Execution(
        execution_id=key.execution_id, workflow_id=key.workflow_id, chain=key.chain,
        conversation_id=conversation_id, user_id=owner_of(conn, conversation_id),
        tool_name=call.name, arguments=call.arguments), AuditStatus.FAILED, error)



def owner_of(conn: Connection, conversation_id: str) -> str:
    """The user whose conversation it is ("" if it has no row)."""
    c = conversation.c
    return conn.scalar(sa.select(c.user_id).where(c.conversation_id == conversation_id),
                       str) or ""
