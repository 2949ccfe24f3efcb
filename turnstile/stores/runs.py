"""Runs of one turn in its conversation: a reset run takes the place of the
run it replaces, and two runs never interleave.

`temporal workflow reset` (like a workflow retry) starts a new *run* of the
same turn: the same workflow id and execution chain (Temporal's
`first_execution_run_id`), a new run id. The new run's history is the base
run's up to the reset point; what the base run wrote to memory after that
point is not part of the new run's story, and the new run writes its own
messages into the same memory slots.

Every run-aware write (`write`, or `claim` inside the caller's transaction)
names its `Writer` — workflow id, chain, run id — and, before it writes,
*claims* its slots:

- the conversation's lock must be held by this run; a lock still naming an
  earlier run of the same turn (or no lock at all) is taken, and a lock held
  by another turn is a `MemoryConflictError` (a `ResetConflict` for a reset
  run): turns of one conversation never interleave;
- rows of *another run of the same turn* in the slots it writes, and at or
  after its `horizon` (the first slot this run has not seen: the rows there
  belong to a future the reset took back), are superseded: moved, with their
  images, into `superseded_message`, marked with the superseding run and the
  time, kept for the record and never read as memory again (model requests,
  snapshots, repairs and the truth check read `chat_message` only). Rows the
  earlier run wrote before the reset point, in slots this run does not
  write, stay: they are part of this run's history too.

Taking an earlier run's place is allowed only to the workflow's current run:
a claim that would take it first fails with `RunUnconfirmed`; the activity
asks Temporal whether its run is running (`activities.run_writes`) and claims again
`confirmed`, or gives up with `RunSuperseded` (an activity of the replaced
run that finished late). So a claim costs one read (the lock's holder and the
replaced run's slots in one statement) while nothing changes hands and one
call to Temporal when a run takes its place.

A reset run that would take back messages later turns built on (rows of
another turn after the first superseded slot) is refused (`ResetConflict`).
Rows without a run id (written before migration 0006, or by other programs)
are never superseded.

The claim takes the lock through turnstile.stores.lock, keeps superseded rows
through turnstile.stores.superseded and removes them through
turnstile.stores.memory (their writers); this module writes no table itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

import sqlalchemy as sa

from turnstile.engine.errors import MemoryConflictError, ResetConflict, TurnstileError
from turnstile.engine.messages import ChatMessage
from turnstile.stores import memory, superseded
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.lock import Holder, hold, holder, lk, take_over_in
from turnstile.stores.memory import (
    MemoryStore,
    SlotWriter,
    chat_message,
    now_iso,
)
from turnstile.stores.message_parts import part_rows
from turnstile.stores.prebuilt import prebuilt

m = chat_message.c


class RunUnconfirmed(TurnstileError):
    """This write would take an earlier run's place (its rows or the lock):
    the caller must first confirm its run is the workflow's current run."""


@dataclass(frozen=True)
class Writer:
    """Who writes: the turn (workflow id + execution chain) and its run."""

    workflow_id: str
    chain: str
    run_id: str
    confirmed: bool = False  # Temporal said this run is running (activities.run_writes)


class _ClaimRow(NamedTuple):
    workflow_id: str | None
    run_id: str | None
    chain: str | None
    seq: int | None  # None: the lock's row; else a slot another run of the turn wrote


def _read(conn: Connection, conv: str, w: Writer, slots: range,
          horizon: int | None) -> tuple[Holder | None, list[int]]:
    """The conversation's lock holder, and the slots holding rows of another
    run of the writer's turn that it replaces: one statement (`_claim_select`)."""
    has_horizon, has_slots = horizon is not None, bool(len(slots))
    params: dict[str, object] = {"conv": conv}
    if has_horizon or has_slots:
        params.update(wf=w.workflow_id, chain=w.chain, run=w.run_id)
    if has_horizon:
        params["horizon"] = horizon
    if has_slots:
        params.update(first=slots[0], last=slots[-1])
    lock: Holder | None = None
    stale: list[int] = []
    for row in conn.rows(_claim_select(has_horizon, has_slots), _ClaimRow, params):
        if row.seq is not None:
            stale.append(int(row.seq))
        elif row.workflow_id is not None and row.run_id is not None:
            lock = Holder(row.workflow_id, row.run_id, row.chain)
    return lock, sorted(stale)


@cache
def _claim_select(horizon: bool, slots: bool) -> sa.Select[Any] | sa.CompoundSelect[Any]:
    """`_read`'s statement, built once per shape (every memory write of a run
    makes it: building it cost about as much as running it, bench/micro.py
    db-reads), its values bound at execution. The lock's row (`seq` NULL),
    then — when the write names slots or a horizon — the replaced runs' rows
    (UNION ALL: one round trip instead of two, per memory write)."""
    lock = sa.select(lk.workflow_id, lk.run_id, lk.execution_chain.label("chain"),
                     sa.cast(sa.null(), sa.Integer).label("seq")).where(
        lk.conversation_id == sa.bindparam("conv"))
    if not (horizon or slots):
        return prebuilt(lock)
    # `seq + 0`, and no ORDER BY: the rows are found through the writer's index
    # (the turn's own rows), never by walking the conversation's primary key
    # from the horizon (SQLite chose that: O(conversation) per write).
    seq = m.seq + sa.literal_column("0")
    where = []
    if horizon:
        where.append(seq >= sa.bindparam("horizon"))
    if slots:
        where.append(seq.between(sa.bindparam("first"), sa.bindparam("last")))
    nothing = sa.cast(sa.null(), sa.Text)
    stale = sa.select(nothing, nothing, nothing, m.seq).where(
        m.conversation_id == sa.bindparam("conv"), m.workflow_id == sa.bindparam("wf"),
        sa.func.coalesce(m.execution_chain, "") == sa.bindparam("chain"),
        m.run_id.is_not(None), m.run_id != sa.bindparam("run"), sa.or_(*where))
    return prebuilt(sa.union_all(lock, stale))


def claim(conn: Connection, conv: str, w: Writer, slots: range = range(0),
          horizon: int | None = None) -> list[int]:
    """Make `w`'s run the one writing `conv` now (see the module's doc), in the
    caller's transaction. Returns the slots whose rows it superseded.
    Raises RunUnconfirmed, MemoryConflictError, ResetConflict."""
    lock, stale = _read(conn, conv, w, slots, horizon)
    if lock is not None and lock.workflow_id != w.workflow_id:
        if stale:
            raise ResetConflict(f"conversation {conv!r} is held by turn {lock.workflow_id}: "
                                f"this reset run of {w.workflow_id} cannot take its messages "
                                "back")
        raise MemoryConflictError(f"conversation {conv!r} is held by turn {lock.workflow_id}; "
                                  "turns of one conversation must not interleave")
    mine = lock is not None and lock.run_id == w.run_id
    if (stale or not mine) and not w.confirmed:
        raise RunUnconfirmed(f"run {w.run_id} of {w.workflow_id} would take an earlier "
                             "run's place in the conversation")
    if stale:
        later = conn.row(sa.select(m.workflow_id).where(
            m.conversation_id == conv, m.seq > stale[0],
            sa.not_(sa.and_(sa.func.coalesce(m.workflow_id, "") == w.workflow_id,
                            sa.func.coalesce(m.execution_chain, "") == w.chain)))
            .order_by(m.seq).limit(1), SlotWriter)
        if later is not None:
            raise ResetConflict(
                f"conversation {conv!r} went on after turn {w.workflow_id} (turn "
                f"{later.workflow_id} wrote after it): a reset of {w.workflow_id} cannot "
                "take those messages back; reset the latest turn or start a new one")
        _move(conn, conv, stale, w.run_id)
    if not mine:
        _hold(conn, conv, w, lock)
    return stale


def _hold(conn: Connection, conv: str, w: Writer, lock: Holder | None) -> None:
    """The confirmed current run of the turn takes the lock: from an earlier
    run of its turn, or free."""
    me = Holder(w.workflow_id, w.run_id, w.chain or None)
    if lock is None:
        hold(conn, conv, me)
    else:
        take_over_in(conn, conv, lock, me)
    held = holder(conn, conv)
    if held is None or not held.runs_as(me):
        raise MemoryConflictError(f"conversation {conv!r} was taken by turn "
                                  f"{held.workflow_id if held else '?'} meanwhile")


def _move(conn: Connection, conv: str, seqs: list[int], by: str) -> None:
    """Supersede the rows at `seqs`: copy them (and their images) into
    `superseded_message`, then remove them from memory."""
    now = now_iso()
    for row in memory.rows_at(conn, conv, seqs):
        parts = [{"idx": p.idx, "type": p.type, "url": p.url, "data": p.data,
                  "mime_type": p.mime_type} for p in part_rows(conn, conv, only=row.seq)]
        superseded.keep(conn, row, parts, by, now)
    memory.remove(conn, conv, seqs)


def write(db: Database, conv: str, start_seq: int, messages: list[ChatMessage],
          w: Writer, horizon: int | None = None, conn: Connection | None = None) -> None:
    """Claim the slots, then store `messages` from `start_seq`, in one
    transaction (MemoryStore.append for a run-aware writer): `conn`'s, when
    given. With no messages it only claims (e.g. the sweep before a model
    request reads)."""
    with db.joined(conn) as conn:
        claim(conn, conv, w, range(start_seq, start_seq + len(messages)), horizon)
        if messages:
            MemoryStore(db).append_in(conn, conv, start_seq, messages, w.workflow_id,
                                      w.chain or None, run_id=w.run_id)
