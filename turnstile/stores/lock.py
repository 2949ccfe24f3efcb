"""One turn at a time per conversation, so memory stays in order.

A turn takes the conversation's lock when it loads memory and gives it back
when it ends. A second turn started meanwhile finds the lock taken: its
load_memory attempt fails with the retryable `ConversationBusy`, and
Temporal retries it (every attempt visible in the history) until the first
turn ends — or, after the activity's schedule-to-close window, the waiting
turn ends `refused`. A holder that no longer runs (terminated, timed out)
is detected through Temporal and its lock taken over with compare-and-set.

The lock is held by the turn — workflow id and execution chain (Temporal's
`first_execution_run_id`) — and records which run of it holds it now: a
reset run of the turn keeps the lock and takes its run's place, while
"has the holder ended?" asks whether the chain still has a running run.
Locks taken before migration 0006 have no chain and are held by their run.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from turnstile.stores.db import Connection, Database, metadata
from turnstile.stores.memory import now_iso

conversation_lock = sa.Table(
    "conversation_lock", metadata,
    sa.Column("conversation_id", sa.Text, primary_key=True),
    sa.Column("workflow_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("acquired_at", sa.Text, nullable=False),
    sa.Column("execution_chain", sa.Text),  # the holding turn's chain (0006)
)


@dataclass(frozen=True)
class Holder:
    workflow_id: str
    run_id: str
    chain: str | None = None  # None: not known (a lock taken before migration 0006)

    def same_turn(self, other: Holder) -> bool:
        """Another run of the same turn (same workflow id and chain)?"""
        return (self.workflow_id == other.workflow_id and self.chain is not None
                and self.chain == other.chain)


class ConversationLocks:
    def __init__(self, db: Database) -> None:
        self.db = db

    def acquire(self, conversation_id: str, me: Holder) -> Holder | None:
        """None when `me` holds the lock now; otherwise the current holder."""
        with self.db.connect() as conn:
            conn.execute(
                "INSERT INTO conversation_lock (conversation_id, workflow_id, run_id, "
                "acquired_at, execution_chain) VALUES (:c, :wf, :run, :now, :chain) "
                "ON CONFLICT (conversation_id) DO NOTHING",
                {"c": conversation_id, "wf": me.workflow_id, "run": me.run_id, "now": now_iso(),
                 "chain": me.chain})
            row = conn.fetchone("SELECT workflow_id, run_id, execution_chain "
                                "FROM conversation_lock WHERE conversation_id = :c",
                                {"c": conversation_id})
        holder = Holder(row["workflow_id"], row["run_id"], row["execution_chain"]) if row \
            else None
        if holder is None or (holder.workflow_id, holder.run_id) == (me.workflow_id, me.run_id):
            return None
        return holder

    def take_over(self, conversation_id: str, stale: Holder, me: Holder) -> bool:
        """Take the lock from `stale` (compare-and-set on its run): a holder that
        ended, or an earlier run of my own turn (a reset run takes its place)."""
        with self.db.connect() as conn:
            cur = conn.execute(
                "UPDATE conversation_lock SET workflow_id = :wf, run_id = :run, "
                "execution_chain = :chain, acquired_at = :now "
                "WHERE conversation_id = :c AND workflow_id = :stale_wf AND run_id = :stale_run",
                {"wf": me.workflow_id, "run": me.run_id, "chain": me.chain, "now": now_iso(),
                 "c": conversation_id, "stale_wf": stale.workflow_id,
                 "stale_run": stale.run_id})
            return bool(cur.rowcount == 1)

    def release(self, conversation_id: str, me: Holder, conn: Connection | None = None) -> None:
        """Only the run that holds the lock now releases it (a run a reset
        replaced never releases its successor's lock). In `conn`'s transaction
        when given."""
        with self.db.joined(conn) as conn:
            conn.execute("DELETE FROM conversation_lock WHERE conversation_id = :c "
                         "AND workflow_id = :wf AND run_id = :run",
                         {"c": conversation_id, "wf": me.workflow_id, "run": me.run_id})
