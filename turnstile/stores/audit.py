"""Audit log: one row per tool execution in `tool_execution_log`.

The row is keyed by the tool call (workflow id + execution chain + call id), so
activity retries update it instead of adding rows. Input parameters are stored with e-mail
addresses and phone numbers masked. TURNSTILE_AUDIT=off turns writing off.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from turnstile.engine.contract import AuditStatus
from turnstile.engine.masking import mask_json_text
from turnstile.stores.db import Connection, Database, metadata
from turnstile.stores.memory import now_iso

MAX_PARAMS_CHARS = 16_384  # the audit row records what was asked, not megabytes of it

def mask(text: str) -> str:
    """Masked text for an audit column: JSON is masked value by value (any
    escaping decoded first), other text as text (turnstile.engine.masking)."""
    return mask_json_text(text)


tool_execution_log = sa.Table(
    "tool_execution_log", metadata,
    sa.Column("execution_id", sa.Text, primary_key=True),
    sa.Column("workflow_id", sa.Text, nullable=False),
    sa.Column("conversation_id", sa.Text, nullable=False),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("tool_name", sa.Text, nullable=False),
    sa.Column("input_params", sa.Text),
    sa.Column("start_time", sa.Text, nullable=False),
    sa.Column("end_time", sa.Text),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("error_message", sa.Text),
    sa.Column("execution_chain", sa.Text),
    sa.Index("tool_execution_log_workflow", "workflow_id"),
    # `starter.py audit` (turnstile.stores.audit_queries): a time window, and
    # failures by time (migration 0004).
    sa.Index("tool_execution_log_time", "start_time", "user_id", "tool_name", "status"),
    sa.Index("tool_execution_log_status_time", "status", "start_time"),
)

approval_decision = sa.Table(
    "approval_decision", metadata,
    sa.Column("workflow_id", sa.Text, primary_key=True),
    sa.Column("execution_chain", sa.Text, primary_key=True, server_default=""),
    sa.Column("tool_call_id", sa.Text, primary_key=True),
    sa.Column("tool_name", sa.Text, nullable=False),
    sa.Column("approved", sa.Integer, nullable=False),
    sa.Column("reviewer", sa.Text, nullable=False),
    sa.Column("note", sa.Text),
    sa.Column("decided_at", sa.Text, nullable=False),
)


def execution_id(workflow_id: str, call_id: str, chain: str = "") -> str:
    """One execution of one tool call: the call id scoped to its turn's
    execution chain (provider call ids repeat across turns and runs)."""
    return f"{workflow_id}/{chain}/{call_id}" if chain else f"{workflow_id}/{call_id}"


class AuditLog:
    def __init__(self, db: Database, enabled: bool = True) -> None:
        self.db = db
        self.enabled = enabled

    def started(
        self,
        *,
        workflow_id: str,
        call_id: str,
        conversation_id: str,
        user_id: str,
        tool_name: str,
        arguments: Any,
        chain: str = "",
        conn: Connection | None = None,
    ) -> None:
        if not self.enabled:
            return
        params = mask(arguments if isinstance(arguments, str)
                      else json.dumps(arguments, default=str))
        if len(params) > MAX_PARAMS_CHARS:
            params = params[:MAX_PARAMS_CHARS] + f"... [truncated, {len(params)} chars in all]"
        with self.db.joined(conn) as conn:
            conn.execute(
                "INSERT INTO tool_execution_log (execution_id, workflow_id, conversation_id, "
                "user_id, tool_name, input_params, start_time, status, execution_chain) "
                "VALUES (:execution_id, :workflow_id, :conversation_id, :user_id, :tool_name, "
                ":input_params, :start_time, :status, :chain) "
                "ON CONFLICT (execution_id) DO UPDATE SET "
                "start_time = excluded.start_time, status = excluded.status, end_time = NULL, "
                "error_message = NULL",
                {
                    "execution_id": execution_id(workflow_id, call_id, chain),
                    "chain": chain or None,
                    "workflow_id": workflow_id, "conversation_id": conversation_id,
                    "user_id": user_id, "tool_name": tool_name, "input_params": params,
                    "start_time": now_iso(), "status": AuditStatus.INITIATED.value,
                },
            )

    def finished(
        self, *, workflow_id: str, call_id: str, status: AuditStatus, error: str | None = None,
        chain: str = "", conn: Connection | None = None,
    ) -> None:
        if not self.enabled:
            return
        with self.db.joined(conn) as conn:
            conn.execute(
                "UPDATE tool_execution_log SET status = :status, end_time = :now, "
                "error_message = :error WHERE execution_id = :execution_id",
                {"status": status.value, "now": now_iso(), "error": mask(error) if error else None,
                 "execution_id": execution_id(workflow_id, call_id, chain)},
            )

    def settled(self, *, workflow_id: str, call_id: str, conversation_id: str, user_id: str,
                tool_name: str, arguments: str, status: AuditStatus, error: str,
                chain: str = "", conn: Connection | None = None) -> None:
        """A call the workflow settled without running the tool: one complete row."""
        with self.db.joined(conn) as conn:
            self.started(workflow_id=workflow_id, call_id=call_id,
                         conversation_id=conversation_id, user_id=user_id, tool_name=tool_name,
                         arguments=arguments, chain=chain, conn=conn)
            self.finished(workflow_id=workflow_id, call_id=call_id, status=status, error=error,
                          chain=chain, conn=conn)

    def decision(self, *, workflow_id: str, tool_name: str, tool_call_id: str, approved: bool,
                 reviewer: str, note: str, decided_at: str, chain: str = "",
                 conn: Connection | None = None) -> None:
        """Who decided what about which call, and when. Recorded even with
        TURNSTILE_AUDIT off: an approval is part of the call, not a log line."""
        with self.db.joined(conn) as conn:
            conn.execute(
                "INSERT INTO approval_decision (workflow_id, execution_chain, tool_call_id, "
                "tool_name, approved, reviewer, note, decided_at) VALUES (:workflow_id, :chain, "
                ":tool_call_id, :tool_name, :approved, :reviewer, :note, :decided_at) "
                "ON CONFLICT (workflow_id, execution_chain, tool_call_id) DO NOTHING",
                {"workflow_id": workflow_id, "chain": chain, "tool_call_id": tool_call_id,
                 "tool_name": tool_name,
                 "approved": int(approved), "reviewer": reviewer, "note": note,
                 "decided_at": decided_at},
            )

    def rows(self, workflow_id: str) -> list[dict[str, Any]]:
        with self.db.connect() as conn:
            return conn.fetchall(
                "SELECT * FROM tool_execution_log WHERE workflow_id = :wf ORDER BY start_time",
                {"wf": workflow_id},
            )
