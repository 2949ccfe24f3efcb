"""One turn at a time per conversation, so memory stays in order.

A turn takes the conversation's lock when it loads memory and gives it back
when it ends. A second turn started meanwhile finds the lock taken: its
load_memory attempt fails with the retryable `ConversationBusy`, and
Temporal retries it (every attempt visible in the history) until the first
turn ends — or, after the activity's schedule-to-close window, the waiting
turn ends `refused`. A holder that no longer runs (terminated, timed out)
is detected through Temporal and its lock taken over with compare-and-set.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from turnstile.stores.db import Database, metadata
from turnstile.stores.memory import now_iso

conversation_lock = sa.Table(
    "conversation_lock", metadata,
    sa.Column("conversation_id", sa.Text, primary_key=True),
    sa.Column("workflow_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("acquired_at", sa.Text, nullable=False),
)


@dataclass(frozen=True)
class Holder:
    workflow_id: str
    run_id: str


class ConversationLocks:
    def __init__(self, db: Database) -> None:
        self.db = db

    def acquire(self, conversation_id: str, me: Holder) -> Holder | None:
        """None when `me` holds the lock now; otherwise the current holder."""
        with self.db.connect() as conn:
            conn.execute(
                "INSERT INTO conversation_lock (conversation_id, workflow_id, run_id, acquired_at)"
                " VALUES (:c, :wf, :run, :now) ON CONFLICT (conversation_id) DO NOTHING",
                {"c": conversation_id, "wf": me.workflow_id, "run": me.run_id, "now": now_iso()})
            row = conn.fetchone("SELECT workflow_id, run_id FROM conversation_lock "
                                "WHERE conversation_id = :c", {"c": conversation_id})
        holder = Holder(row["workflow_id"], row["run_id"]) if row else None
        return None if holder == me else holder

    def take_over(self, conversation_id: str, stale: Holder, me: Holder) -> bool:
        with self.db.connect() as conn:
            cur = conn.execute(
                "UPDATE conversation_lock SET workflow_id = :wf, run_id = :run, acquired_at = :now "
                "WHERE conversation_id = :c AND workflow_id = :stale_wf AND run_id = :stale_run",
                {"wf": me.workflow_id, "run": me.run_id, "now": now_iso(), "c": conversation_id,
                 "stale_wf": stale.workflow_id, "stale_run": stale.run_id})
            return bool(cur.rowcount == 1)

    def release(self, conversation_id: str, me: Holder) -> None:
        with self.db.connect() as conn:
            conn.execute("DELETE FROM conversation_lock WHERE conversation_id = :c "
                         "AND workflow_id = :wf AND run_id = :run",
                         {"c": conversation_id, "wf": me.workflow_id, "run": me.run_id})
