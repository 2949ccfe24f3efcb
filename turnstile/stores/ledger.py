"""The per-call tool ledger: one row per tool call of a turn, written with
compare-and-set, so a new attempt knows whether an earlier one finished,
failed cleanly, or vanished mid-run (docs/design.md, "The call ledger").

`tool_call_ledger` is declared and read here; its one writer is the call
journal (turnstile.stores.journal, statements in journal_writes).
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, NamedTuple

import sqlalchemy as sa
from pydantic import BaseModel

from turnstile.engine.contract import CallStatus
from turnstile.stores.call_key import CallKey, key_columns
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.tables import metadata

tool_call_ledger = sa.Table(
    "tool_call_ledger", metadata,
    *key_columns(),
    sa.Column("tool_name", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="1"),
    sa.Column("result", sa.Text),
    sa.Column("is_error", sa.Integer, nullable=False, server_default="0"),
    sa.Column("outcome", sa.Text),
    sa.Column("state", sa.Text),
    sa.Column("started_at", sa.Text, nullable=False),
    sa.Column("finished_at", sa.Text),
)
c = tool_call_ledger.c


class LedgerStatus(StrEnum):
    """`tool_call_ledger.status`."""

    STARTED = "STARTED"
    COMPLETED = "COMPLETED"
    ATTEMPT_FAILED = "ATTEMPT_FAILED"


class LedgerRow(BaseModel):
    """One call's row, as read."""

    tool_name: str
    status: LedgerStatus
    attempts: int
    result: str | None = None
    is_error: bool = False
    outcome: CallStatus | None = None  # what the finished attempt reported
    state: dict[str, Any] | None = None  # cross-round state the tool returned

    @property
    def reported(self) -> CallStatus:
        """How the finished call ended (rows before `outcome` was kept: by `is_error`)."""
        return self.outcome or (CallStatus.FAILED if self.is_error else CallStatus.COMPLETED)

    @property
    def took_effect(self) -> bool:
        return self.status is LedgerStatus.COMPLETED and self.reported is CallStatus.COMPLETED


class _Stored(NamedTuple):
    """A ledger row's columns as stored (JSON text, 0/1)."""

    tool_name: str
    status: str
    attempts: int
    result: str | None
    is_error: int
    outcome: str | None
    state: str | None


class LedgerEntry(BaseModel):
    """What `CallJournal.begin` found for an attempt."""

    status: LedgerStatus
    fresh: bool  # this attempt owns the execution
    result: str | None = None
    is_error: bool = False
    outcome: CallStatus | None = None  # what the finished attempt reported
    state: dict[str, Any] | None = None  # cross-round state the tool returned
    attempts: int = 1


def read(conn: Connection, key: CallKey) -> LedgerRow | None:
    """The call's ledger row, in the caller's transaction."""
    row = conn.row(sa.select(c.tool_name, c.status, c.attempts, c.result, c.is_error,
                             c.outcome, c.state).where(key.of(tool_call_ledger)), _Stored)
    if row is None:
        return None
    return LedgerRow(tool_name=row.tool_name, status=LedgerStatus(row.status),
                     attempts=row.attempts, result=row.result, is_error=bool(row.is_error),
                     outcome=None if row.outcome is None else CallStatus(row.outcome),
                     state=json.loads(row.state) if row.state else None)


class ToolLedger:
    """Reads of the ledger (the call journal writes it)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def row(self, workflow_id: str, call_id: str, chain: str = "") -> LedgerRow | None:
        with self.db.connect() as conn:
            return read(conn, CallKey(workflow_id, chain, call_id))

    def status(self, workflow_id: str, call_id: str, chain: str = "") -> LedgerStatus | None:
        """STARTED (an attempt claimed it and has not ended), COMPLETED,
        ATTEMPT_FAILED, or None (never claimed)."""
        row = self.row(workflow_id, call_id, chain)
        return None if row is None else row.status

    def result(self, workflow_id: str, call_id: str, chain: str = "") -> str | None:
        """The stored result of a completed call (None: not completed)."""
        row = self.row(workflow_id, call_id, chain)
        return row.result if row is not None and row.status is LedgerStatus.COMPLETED else None
