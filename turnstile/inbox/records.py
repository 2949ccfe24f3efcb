"""What the inbox reads from the database (never writes): decisions taken
(`approval_decision`, with the audit row of a call approved with edits) and
a conversation's recent messages, masked. Blocking: the pages call these in
a thread.

Read through the application's own login, not `connect(readonly=True)`: on
PostgreSQL that is the query tool's SELECT-only role (`turnstile_reader`),
which may read the sales tables only (row-level security), never the
decisions or anyone's messages."""

from __future__ import annotations

import json
from dataclasses import dataclass

import sqlalchemy as sa

from turnstile.engine.contract import AuditStatus
from turnstile.engine.masking import mask_text
from turnstile.stores.audit import approval_decision, tool_execution_log
from turnstile.stores.call_key import execution_id
from turnstile.stores.db import Database
from turnstile.stores.memory import chat_message

d, log, m = approval_decision.c, tool_execution_log.c, chat_message.c

# A message on the call page is shown up to this many characters.
MESSAGE_CHARS = 2000


@dataclass(frozen=True)
class Decided:
    """One decision that took effect, as the "decided" view and a decided
    call's page show it."""

    workflow_id: str
    tool_call_id: str
    tool_name: str
    approved: bool
    reviewer: str
    note: str
    decided_at: str
    requester: str = ""
    # Approved with edits: the reviewer's arguments the tool ran with, masked
    # (`approval_decision.edited_arguments`; None for a decision recorded
    # before migration 0010, whose edits only the audit row holds).
    edited_arguments: str | None = None
    edits: str | None = None  # the audit row's masked arguments when approved with edits

    @property
    def verdict(self) -> str:
        if not self.approved:
            return "rejected"
        edited = self.edited_arguments is not None or self.edits is not None
        return "approved with edits" if edited else "approved"

    @property
    def edited_text(self) -> str | None:
        """The edited arguments as shown: indented JSON (as stored, if it is
        not JSON: a value cut at the audit's bound)."""
        if self.edited_arguments is None:
            return None
        try:
            return json.dumps(json.loads(self.edited_arguments), indent=2, ensure_ascii=False)
        except ValueError:
            return self.edited_arguments


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    created_at: str


def _execution(r: sa.Row[tuple[object, ...]], suffix: str = "") -> str:
    return execution_id(str(r.workflow_id), str(r.tool_call_id) + suffix,
                        str(r.execution_chain or ""))


# The call journal's row of an approval with edits: the call's own id + this
# (turnstile.stores.journal, `_audit_edits`), both versions masked.
EDITED = "/edited"


def _decided(rows: list[sa.Row[tuple[object, ...]]], audit: dict[str, tuple[str, str, str]]
             ) -> list[Decided]:
    out = []
    for r in rows:
        _, _, user = audit.get(_execution(r), ("", "", ""))
        status, params, edit_user = audit.get(_execution(r, EDITED), ("", "", ""))
        out.append(Decided(
            workflow_id=str(r.workflow_id), tool_call_id=str(r.tool_call_id),
            tool_name=str(r.tool_name), approved=bool(r.approved), reviewer=str(r.reviewer),
            note=str(r.note or ""), decided_at=str(r.decided_at), requester=user or edit_user,
            edited_arguments=None if r.edited_arguments is None else str(r.edited_arguments),
            edits=params if status == AuditStatus.APPROVED_WITH_EDITS else None))
    return out


def _audit_of(db: Database, rows: list[sa.Row[tuple[object, ...]]]
              ) -> dict[str, tuple[str, str, str]]:
    ids = [_execution(r, suffix) for r in rows for suffix in ("", EDITED)]
    if not ids:
        return {}
    with db.connect() as conn:
        found = conn.execute(sa.select(log.execution_id, log.status, log.input_params,
                                       log.user_id).where(log.execution_id.in_(ids))).all()
    return {str(a.execution_id): (str(a.status), str(a.input_params or ""), str(a.user_id))
            for a in found}


def recent_decisions(db: Database, limit: int = 100, query: str = "") -> list[Decided]:
    """The newest decisions first; `query`: a case-insensitive substring of
    the tool, reviewer, note or workflow id."""
    stmt = sa.select(approval_decision).order_by(d.decided_at.desc()).limit(limit)
    if query:
        like = f"%{query.lower()}%"
        stmt = stmt.where(sa.or_(*(sa.func.lower(c).like(like) for c in (
            d.tool_name, d.reviewer, d.note, d.workflow_id))))
    with db.connect() as conn:
        rows = list(conn.execute(stmt).all())
    return _decided(rows, _audit_of(db, rows))


def decision_of(db: Database, workflow_id: str, tool_call_id: str) -> Decided | None:
    """The latest decision on a call of this workflow id (any run chain)."""
    stmt = (sa.select(approval_decision).where(d.workflow_id == workflow_id,
                                               d.tool_call_id == tool_call_id)
            .order_by(d.decided_at.desc()).limit(1))
    with db.connect() as conn:
        rows = list(conn.execute(stmt).all())
    found = _decided(rows, _audit_of(db, rows))
    return found[0] if found else None


def recent_messages(db: Database, conversation_id: str, limit: int = 6) -> list[Message]:
    """The conversation's latest user and assistant messages, oldest first,
    masked as the audit log masks (e-mail addresses, phone numbers)."""
    stmt = (sa.select(m.role, m.content, m.created_at)
            .where(m.conversation_id == conversation_id, m.role.in_(("user", "assistant")),
                   m.content.is_not(None), m.content != "")
            .order_by(m.seq.desc()).limit(limit))
    with db.connect() as conn:
        rows = conn.execute(stmt).all()
    return [Message(role=str(r.role), content=mask_text(str(r.content))[:MESSAGE_CHARS],
                    created_at=str(r.created_at or "")) for r in reversed(rows)]
