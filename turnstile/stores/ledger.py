"""The per-call tool ledger: one row per tool call of a turn, written with
compare-and-set, so a new attempt knows whether an earlier one finished,
failed cleanly, or vanished mid-run (docs/design.md, "The call ledger").
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel

from turnstile.engine.contract import CallStatus
from turnstile.engine.errors import CallTakenOver
from turnstile.stores.db import Connection, Database, metadata
from turnstile.stores.memory import now_iso

tool_call_ledger = sa.Table(
    "tool_call_ledger", metadata,
    sa.Column("workflow_id", sa.Text, primary_key=True),
    # Temporal's first_execution_run_id: a new start of a closed workflow id is
    # a new chain, so provider call ids that repeat (call_0...) never collide.
    sa.Column("execution_chain", sa.Text, primary_key=True, server_default=""),
    sa.Column("tool_call_id", sa.Text, primary_key=True),
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


class LedgerStatus(StrEnum):
    """`tool_call_ledger.status`."""

    STARTED = "STARTED"
    COMPLETED = "COMPLETED"
    ATTEMPT_FAILED = "ATTEMPT_FAILED"


class LedgerEntry(BaseModel):
    status: LedgerStatus
    fresh: bool  # this attempt owns the execution
    result: str | None = None
    is_error: bool = False
    outcome: CallStatus | None = None  # what the finished attempt reported
    state: dict[str, Any] | None = None  # cross-round state the tool returned
    attempts: int = 1


class ToolLedger:
    """Written once per tool call, compare-and-set: tells a new attempt
    whether an earlier one finished, failed cleanly, or vanished mid-run."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def begin(self, workflow_id: str, call_id: str, tool_name: str, *,
              rerun_lost: bool, chain: str = "",
              conn: Connection | None = None) -> LedgerEntry:
        """Claim the call for this attempt (compare-and-set). `attempts` of
        the entry is the claim: `complete` and `attempt_failed` with it
        change the row only while no later attempt has claimed it since."""
        with self.db.joined(conn) as conn:
            key = {"wf": workflow_id, "chain": chain, "call": call_id}
            cur = conn.execute(
                "INSERT INTO tool_call_ledger (workflow_id, execution_chain, tool_call_id, "
                "tool_name, status, started_at) VALUES (:wf, :chain, :call, :tool, 'STARTED', "
                ":now) ON CONFLICT (workflow_id, execution_chain, tool_call_id) DO NOTHING",
                {**key, "tool": tool_name, "now": now_iso()},
            )
            if cur.rowcount == 1:
                return LedgerEntry(status=LedgerStatus.STARTED, fresh=True)
            for _ in range(3):  # another attempt may change the row between read and claim
                entry = self._claim(conn, key, rerun_lost)
                if entry is not None:
                    return entry
            raise CallTakenOver(f"tool call {call_id} of {workflow_id}: its ledger row keeps "
                                "changing (another attempt of the call is running)")

    @staticmethod
    def _claim(conn: Connection, key: dict[str, str], rerun_lost: bool) -> LedgerEntry | None:
        row = conn.fetchone(
            "SELECT * FROM tool_call_ledger WHERE workflow_id = :wf "
            "AND execution_chain = :chain AND tool_call_id = :call", key)
        assert row is not None
        if row["status"] == "COMPLETED":
            return LedgerEntry(
                status=LedgerStatus.COMPLETED, fresh=False, result=row["result"],
                is_error=bool(row["is_error"]), attempts=row["attempts"],
                outcome=row["outcome"],
                state=json.loads(row["state"]) if row["state"] else None,
            )
        if row["status"] == "ATTEMPT_FAILED" or rerun_lost:
            cur = conn.execute(
                "UPDATE tool_call_ledger SET status = 'STARTED', attempts = attempts + 1, "
                "started_at = :now WHERE workflow_id = :wf AND execution_chain = :chain "
                "AND tool_call_id = :call AND status = :seen AND attempts = :n",
                {**key, "now": now_iso(), "seen": row["status"], "n": row["attempts"]},
            )
            if cur.rowcount != 1:
                return None
            return LedgerEntry(status=LedgerStatus.STARTED, fresh=True,
                               attempts=row["attempts"] + 1)
        # STARTED and never finished: an earlier attempt was lost mid-run.
        return LedgerEntry(status=LedgerStatus.STARTED, fresh=False, attempts=row["attempts"])

    def status(self, workflow_id: str, call_id: str, chain: str = "") -> str | None:
        """STARTED (an attempt claimed it and has not ended), COMPLETED,
        ATTEMPT_FAILED, or None (never claimed)."""
        with self.db.connect() as conn:
            row = conn.fetchone(
                "SELECT status FROM tool_call_ledger WHERE workflow_id = :wf "
                "AND execution_chain = :chain AND tool_call_id = :call",
                {"wf": workflow_id, "chain": chain, "call": call_id})
        return None if row is None else str(row["status"])

    def result(self, workflow_id: str, call_id: str, chain: str = "") -> str | None:
        with self.db.connect() as conn:
            row = conn.fetchone(
                "SELECT result FROM tool_call_ledger WHERE workflow_id = :wf "
                "AND execution_chain = :chain AND tool_call_id = :call AND status = 'COMPLETED'",
                {"wf": workflow_id, "chain": chain, "call": call_id})
        return None if row is None else row["result"]

    def complete(self, workflow_id: str, call_id: str, result: str, is_error: bool,
                 outcome: CallStatus, state: dict[str, Any] | None = None,
                 chain: str = "", conn: Connection | None = None,
                 attempt: int | None = None) -> None:
        """`attempt`: the claim `begin` returned; only while it still holds
        (else CallTakenOver: the caller's transaction must roll back)."""
        fence = "" if attempt is None else " AND status = 'STARTED' AND attempts = :n"
        with self.db.joined(conn) as conn:
            cur = conn.execute(
                "UPDATE tool_call_ledger SET status = 'COMPLETED', result = :result, "
                "is_error = :is_error, outcome = :outcome, state = :state, finished_at = :now "
                "WHERE workflow_id = :wf AND execution_chain = :chain AND tool_call_id = :call"
                + fence,
                {"result": result, "is_error": int(is_error), "outcome": outcome.value,
                 "state": json.dumps(state) if state else None, "now": now_iso(),
                 "wf": workflow_id, "chain": chain, "call": call_id, "n": attempt},
            )
            if attempt is not None and cur.rowcount != 1:
                raise CallTakenOver(f"tool call {call_id} of {workflow_id}: a later attempt "
                                    f"claimed it from attempt {attempt}")

    def attempt_failed(self, workflow_id: str, call_id: str, error: str,
                       chain: str = "", attempt: int | None = None,
                       conn: Connection | None = None) -> None:
        """The tool raised: the attempt ended cleanly, so a retry may run it again."""
        fence = "" if attempt is None else " AND attempts = :n"
        with self.db.joined(conn) as conn:
            conn.execute(
                "UPDATE tool_call_ledger SET status = 'ATTEMPT_FAILED', result = :error, "
                "finished_at = :now WHERE workflow_id = :wf AND execution_chain = :chain "
                "AND tool_call_id = :call AND status = 'STARTED'" + fence,
                {"error": error, "now": now_iso(), "wf": workflow_id, "chain": chain,
                 "call": call_id, "n": attempt},
            )
