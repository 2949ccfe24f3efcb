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

This module is the one writer of `conversation_lock`: a reset run's claim
(turnstile.stores.runs) takes the lock through `hold` and `take_over_in`.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.memory import now_iso
from turnstile.stores.prebuilt import prebuilt
from turnstile.stores.tables import metadata, text_columns

conversation_lock = sa.Table(
    "conversation_lock", metadata,
    sa.Column("conversation_id", sa.Text, primary_key=True),
    *text_columns("workflow_id", "run_id", "acquired_at"),
    sa.Column("execution_chain", sa.Text),  # the holding turn's chain (0006)
)
lk = conversation_lock.c


@dataclass(frozen=True)
class Holder:
    workflow_id: str
    run_id: str
    chain: str | None = None  # None: not known (a lock taken before migration 0006)

    def same_turn(self, other: Holder) -> bool:
        """Another run of the same turn (same workflow id and chain)?"""
        return (self.workflow_id == other.workflow_id and self.chain is not None
                and self.chain == other.chain)

    def runs_as(self, other: Holder) -> bool:
        """The same run of the same turn?"""
        return (self.workflow_id, self.run_id) == (other.workflow_id, other.run_id)


@dataclass(frozen=True)
class Lock:
    """A `conversation_lock` row: the conversation and its holder."""

    conversation_id: str
    workflow_id: str
    run_id: str
    chain: str | None

    @property
    def holder(self) -> Holder:
        return Holder(self.workflow_id, self.run_id, self.chain)


_LOCKS = sa.select(lk.conversation_id, lk.workflow_id, lk.run_id,
                   lk.execution_chain.label("chain"))
# Built once: every memory write of a turn's run reads its conversation's lock
# (turnstile.stores.runs.claim), and building the SELECT each time cost about
# as much as running it (bench/micro.py db-reads).
_LOCK_OF = prebuilt(_LOCKS.where(lk.conversation_id == sa.bindparam("conversation_id")))
# Every turn's end (ConversationLocks.release); built once as well.
_RELEASE = prebuilt(sa.delete(conversation_lock).where(
    lk.conversation_id == sa.bindparam("conversation_id"),
    lk.workflow_id == sa.bindparam("workflow_id"), lk.run_id == sa.bindparam("run_id")))


def locks(conn: Connection, conversation_id: str | None = None) -> list[Lock]:
    """The locks held (of `conversation_id` only, when given)."""
    if conversation_id is None:
        return conn.rows(_LOCKS, Lock)
    return conn.rows(_LOCK_OF, Lock, {"conversation_id": conversation_id})


def holder(conn: Connection, conversation_id: str) -> Holder | None:
    """Who holds the conversation's lock now (None: nobody)."""
    held = locks(conn, conversation_id)
    return held[0].holder if held else None


def hold(conn: Connection, conversation_id: str, me: Holder) -> Holder | None:
    """Take the lock if it is free, in the caller's transaction. None when
    `me` holds it now; otherwise the current holder."""
    conn.insert_new(conversation_lock, {"conversation_id": conversation_id,
                                        "workflow_id": me.workflow_id, "run_id": me.run_id,
                                        "acquired_at": now_iso(), "execution_chain": me.chain})
    now = holder(conn, conversation_id)
    return None if now is None or now.runs_as(me) else now


def take_over_in(conn: Connection, conversation_id: str, stale: Holder, me: Holder) -> bool:
    """`take_over` in the caller's transaction."""
    cur = conn.execute(
        sa.update(conversation_lock)
        .where(lk.conversation_id == conversation_id, lk.workflow_id == stale.workflow_id,
               lk.run_id == stale.run_id)
        .values(workflow_id=me.workflow_id, run_id=me.run_id, execution_chain=me.chain,
                acquired_at=now_iso()))
    return bool(cur.rowcount == 1)


class ConversationLocks:
    def __init__(self, db: Database) -> None:
        self.db = db

    def acquire(self, conversation_id: str, me: Holder) -> Holder | None:
        """None when `me` holds the lock now; otherwise the current holder."""
        with self.db.connect() as conn:
            return hold(conn, conversation_id, me)

    def take_over(self, conversation_id: str, stale: Holder, me: Holder) -> bool:
        """Take the lock from `stale` (compare-and-set on its run): a holder that
        ended, or an earlier run of my own turn (a reset run takes its place)."""
        with self.db.connect() as conn:
            return take_over_in(conn, conversation_id, stale, me)

    def release(self, conversation_id: str, me: Holder, conn: Connection | None = None) -> None:
        """Only the run that holds the lock now releases it (a run a reset
        replaced never releases its successor's lock). In `conn`'s transaction
        when given."""
        with self.db.joined(conn) as conn:
            conn.changed(_RELEASE, {"conversation_id": conversation_id,
                                    "workflow_id": me.workflow_id, "run_id": me.run_id})
