"""A conversation as memory holds it, readable: `starter.py conversation
show ID [--json]` and `TurnstileClient.conversation(ID)`.

Every message in `seq` order, as stored, with the tool calls and their
arguments (masked as the audit log masks them: e-mail addresses, phone
numbers, secrets), each tool result with its marks — what the turn did to it after it
was written: rolled back, not run, interrupted, rejected, repaired (written
by a later turn for a call whose turn ended without one), superseded (the
call belonged to a run a reset replaced), effect may remain — and, for calls
that waited for a person, the decision and who made it (`approval_decision`),
with the reviewer's arguments when the call was approved with edits.
Read only; `Transcript` is a pydantic model, so its JSON reads back as itself.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, Field

from turnstile.engine import attributes as attr
from turnstile.engine.contract import CallStatus
from turnstile.engine.masking import mask_json_text
from turnstile.stores.audit import approval_decision
from turnstile.stores.db import Database
from turnstile.stores.memory import MessageRow, chat_message, conversation

NOT_RUN_PREFIX = "Not run:"  # workflows/tool_round.py, a call a cancel never ran


class Decision(BaseModel):
    approved: bool
    reviewer: str
    note: str = ""
    decided_at: str = ""
    # Approved with edits: the reviewer's arguments the call ran with, masked
    # (`approval_decision.edited_arguments`); parsed JSON when it parses.
    edited_arguments: Any = None


class CallView(BaseModel):
    id: str
    name: str
    arguments: Any  # masked; parsed JSON when it parses, else the (masked) text
    decision: Decision | None = None


class Entry(BaseModel):
    seq: int
    role: str
    content: str | None = None
    calls: list[CallView] = Field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    is_error: bool = False
    marks: list[str] = Field(default_factory=list)
    workflow_id: str | None = None


class Transcript(BaseModel):
    conversation_id: str
    user_id: str | None = None
    entries: list[Entry] = Field(default_factory=list)

    def lines(self) -> list[str]:
        """The readable transcript."""
        out = [f"conversation {self.conversation_id} (user {self.user_id or '?'}): "
               f"{len(self.entries)} message(s)"]
        for e in self.entries:
            marks = "".join(f" [{m.upper()}]" for m in e.marks)
            if e.role == "tool":
                error = " (error)" if e.is_error else ""
                out.append(f"#{e.seq} result of {e.tool_name or '?'} {e.tool_call_id}"
                           f"{marks}{error}:")
            else:
                out.append(f"#{e.seq} {e.role}{marks}:")
            if e.content:
                out.extend(f"    {line}" for line in e.content.splitlines())
            for c in e.calls:
                args = json.dumps(c.arguments, ensure_ascii=False) \
                    if not isinstance(c.arguments, str) else c.arguments
                out.append(f"    -> call {c.name} {c.id} {args}")
                if c.decision is not None:
                    out.extend(_decision_lines(c.decision))
        return out


def _decision_lines(d: Decision) -> list[str]:
    edited = d.edited_arguments is not None
    verdict = "rejected" if not d.approved else "approved with edits" if edited else "approved"
    note = f": {d.note}" if d.note else ""
    lines = [f"       {verdict} by {d.reviewer} at {d.decided_at}{note}"]
    if edited:
        args = d.edited_arguments if isinstance(d.edited_arguments, str) else json.dumps(
            d.edited_arguments, ensure_ascii=False)
        lines.append(f"       ran with {args}")
    return lines


def marks_of(role: str, content: str | None, attributes: dict[str, Any]) -> list[str]:
    if role != "tool":
        return ["discarded"] if attributes.get(attr.DISCARDED) else []
    marks = []
    outcome = attributes.get(attr.OUTCOME)
    if attributes.get(attr.ROLLED_BACK) or outcome == CallStatus.ROLLED_BACK:
        marks.append("rolled back")
    if (content or "").startswith(NOT_RUN_PREFIX):
        marks.append("not run")
    elif outcome in (CallStatus.INTERRUPTED, CallStatus.REJECTED, CallStatus.REPEATED):
        marks.append(str(outcome))
    if attributes.get(attr.REPAIRED):
        marks.append("repaired")
    if attributes.get(attr.SUPERSEDED_EFFECT):
        marks.append("superseded")
    if attributes.get(attr.EFFECT_MAY_REMAIN):
        marks.append("effect may remain")
    return marks


def _arguments(raw: str) -> Any:
    masked = mask_json_text(raw)
    try:
        return json.loads(masked)
    except ValueError:
        return masked


def read_transcript(db: Database, conversation_id: str) -> Transcript:
    with db.connect() as conn:
        user = conn.scalar(sa.select(conversation.c.user_id).where(
            conversation.c.conversation_id == conversation_id), str)
        rows = conn.rows(sa.select(chat_message).where(
            chat_message.c.conversation_id == conversation_id).order_by(chat_message.c.seq),
            MessageRow)
        decided = conn.execute(sa.select(
            approval_decision.c.workflow_id, approval_decision.c.tool_call_id,
            approval_decision.c.approved, approval_decision.c.reviewer,
            approval_decision.c.note, approval_decision.c.decided_at,
            approval_decision.c.edited_arguments).where(
            approval_decision.c.workflow_id.in_(
                {r.workflow_id for r in rows if r.workflow_id}))).all()
    decisions = {(d.workflow_id, d.tool_call_id): Decision(
        approved=bool(d.approved), reviewer=d.reviewer, note=d.note or "",
        decided_at=d.decided_at or "",
        edited_arguments=None if d.edited_arguments is None else _arguments(d.edited_arguments))
        for d in decided}
    names: dict[str, str] = {}
    entries = []
    for row in rows:
        msg = row.message()
        wf = row.workflow_id or msg.attributes.get(attr.WORKFLOW_ID)
        calls = [CallView(id=c.id, name=c.name, arguments=_arguments(c.arguments),
                          decision=decisions.get((wf, c.id)) if wf else None)
                 for c in msg.tool_calls]
        names.update({c.id: c.name for c in msg.tool_calls})
        content = msg.content
        if msg.role == "user" and content is not None:
            content = msg.attributes.get(attr.RAW_USER_MESSAGE) or content
        entries.append(Entry(
            seq=row.seq, role=msg.role, content=content,
            calls=calls, tool_call_id=msg.tool_call_id,
            tool_name=msg.attributes.get(attr.TOOL_NAME) or names.get(msg.tool_call_id or ""),
            is_error=msg.is_error, marks=marks_of(msg.role, msg.content, msg.attributes),
            workflow_id=wf))
    return Transcript(conversation_id=conversation_id, user_id=user, entries=entries)
