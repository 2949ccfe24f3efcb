"""Audit log: one row per tool execution in `tool_execution_log`, and who
decided what about a call in `approval_decision`.

The row is keyed by the tool call (`execution_id`: workflow id + execution
chain + call id), so activity retries update it instead of adding rows.
Input parameters are stored with e-mail addresses and phone numbers masked.
TURNSTILE_AUDIT=off turns writing the log off (decisions are always kept).

Both tables are declared and read here; their one writer is the call journal
(turnstile.stores.journal, statements in journal_writes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from turnstile.engine.contract import AuditStatus
from turnstile.engine.flow import Provenance
from turnstile.engine.masking import mask_any, mask_json_text
from turnstile.stores.call_key import execution_id, key_columns
from turnstile.stores.db import Database
from turnstile.stores.tables import metadata

__all__ = ["AuditLog", "AuditRow", "approval_decision", "execution_id", "mask",
           "masked_params", "provenance_text", "tool_execution_log"]

MAX_PARAMS_CHARS = 16_384  # the audit row records what was asked, not megabytes of it


def mask(text: str) -> str:
    """Masked text for an audit column: JSON is masked value by value (any
    escaping decoded first), other text as text (turnstile.engine.masking)."""
    return mask_json_text(text)


def masked_params(arguments: Any) -> str:
    """A call's arguments as the audit row keeps them: masked, bounded."""
    params = mask(arguments if isinstance(arguments, str)
                  else json.dumps(arguments, default=str))
    if len(params) > MAX_PARAMS_CHARS:
        params = params[:MAX_PARAMS_CHARS] + f"... [truncated, {len(params)} chars in all]"
    return params


def provenance_text(provenance: Provenance) -> str:
    """An audit row's `provenance`: argument -> sources as JSON, masked (the
    sources' values and excerpts are masked when derived; masked again here,
    as everything the audit log keeps)."""
    return json.dumps(mask_any({name: [s.model_dump(mode="json") for s in sources]
                                for name, sources in provenance.items()}),
                      ensure_ascii=False, sort_keys=True)


def _texts(*names: str) -> list[sa.Column[str]]:
    """Required text columns."""
    return [sa.Column(name, sa.Text, nullable=False) for name in names]


tool_execution_log = sa.Table(
    "tool_execution_log", metadata,
    sa.Column("execution_id", sa.Text, primary_key=True),
    *_texts("workflow_id", "conversation_id", "user_id", "tool_name"),
    sa.Column("input_params", sa.Text),
    *_texts("start_time"),
    sa.Column("end_time", sa.Text),
    *_texts("status"),
    sa.Column("error_message", sa.Text),
    sa.Column("execution_chain", sa.Text),
    # A call of a tool that asks by condition (`@tool(approval=...)`) and
    # waited: the condition's words, as the reviewer saw them
    # (PendingApproval.reason; migration 0013); NULL otherwise.
    sa.Column("approval_reason", sa.Text),
    # A call of a tool with sensitive arguments (`@tool(sensitive=...)`, in a
    # turn begun at revision 7 or later): where their values came from, as
    # JSON text (argument -> sources; turnstile.engine.flow), masked
    # (migration 0014); NULL otherwise.
    sa.Column("provenance", sa.Text),
    sa.Index("tool_execution_log_workflow", "workflow_id"),
    # `starter.py audit` (turnstile.stores.audit_queries): a time window, and
    # failures by time (migration 0004).
    sa.Index("tool_execution_log_time", "start_time", "user_id", "tool_name", "status"),
    sa.Index("tool_execution_log_status_time", "status", "start_time"),
)

approval_decision = sa.Table(
    "approval_decision", metadata,
    *key_columns(),
    *_texts("tool_name"),
    sa.Column("approved", sa.Integer, nullable=False),
    *_texts("reviewer"),
    sa.Column("note", sa.Text),
    *_texts("decided_at"),
    # Approved with edits: the reviewer's arguments the tool ran with, masked
    # and bounded as `masked_params` keeps arguments (migration 0010); NULL otherwise.
    sa.Column("edited_arguments", sa.Text),
)


@dataclass(frozen=True)
class AuditRow:
    """One row of `tool_execution_log`."""

    execution_id: str
    workflow_id: str
    conversation_id: str
    user_id: str
    tool_name: str
    input_params: str | None
    start_time: str
    end_time: str | None
    status: AuditStatus
    error_message: str | None
    execution_chain: str | None
    approval_reason: str | None = None  # why it waited (a condition's words)
    provenance: str | None = None  # JSON: where the sensitive arguments' values came from

    @classmethod
    def stored(cls, status: str, **columns: Any) -> AuditRow:
        """The row from its columns as selected (`status` as stored)."""
        return cls(status=AuditStatus(status), **columns)


class AuditLog:
    """Reads of the audit log (the call journal writes it)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def rows(self, workflow_id: str) -> list[AuditRow]:
        t = tool_execution_log
        stmt = sa.select(t).where(t.c.workflow_id == workflow_id).order_by(t.c.start_time)
        with self.db.connect() as conn:
            return conn.rows(stmt, AuditRow.stored)
