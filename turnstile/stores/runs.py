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
asks Temporal whether its run is running (`activities.runs`) and claims again
`confirmed`, or gives up with `RunSuperseded` (an activity of the replaced
run that finished late). So a claim costs two reads while nothing changes
hands and one call to Temporal when a run takes its place.

A reset run that would take back messages later turns built on (rows of
another turn after the first superseded slot) is refused (`ResetConflict`).
Rows without a run id (written before migration 0006, or by other programs)
are never superseded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from turnstile.engine import attributes as attr
from turnstile.engine.errors import MemoryConflictError, ResetConflict, TurnstileError
from turnstile.engine.messages import ChatMessage
from turnstile.stores.db import FLAG_FALSE, Connection, Database, Flag, metadata
from turnstile.stores.memory import MemoryStore, lower_answered_through, now_iso

superseded_message = sa.Table(
    "superseded_message", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("conversation_id", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),  # the slot it had in chat_message
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("content", sa.Text),
    sa.Column("tool_calls", sa.Text),
    sa.Column("tool_call_id", sa.Text),
    sa.Column("is_error", Flag, nullable=False, server_default=FLAG_FALSE),
    sa.Column("attributes", sa.Text),
    sa.Column("parts", sa.Text),  # its chat_message_part rows, as a JSON list
    sa.Column("created_at", sa.Text),
    sa.Column("workflow_id", sa.Text),
    sa.Column("execution_chain", sa.Text),
    sa.Column("run_id", sa.Text),  # the run that wrote it
    sa.Column("superseded_by", sa.Text, nullable=False),  # the run that took its slot
    sa.Column("superseded_at", sa.Text, nullable=False),
    # When what became of its tool calls was recorded (turnstile.stores.superseded).
    sa.Column("settled_at", sa.Text),
    sa.Index("superseded_message_conversation", "conversation_id", "seq"),
)

_COLUMNS = ("conversation_id", "seq", "role", "content", "tool_calls", "tool_call_id",
            "is_error", "attributes", "created_at", "workflow_id", "execution_chain", "run_id")


class RunUnconfirmed(TurnstileError):
    """This write would take an earlier run's place (its rows or the lock):
    the caller must first confirm its run is the workflow's current run."""


@dataclass(frozen=True)
class Writer:
    """Who writes: the turn (workflow id + execution chain) and its run."""

    workflow_id: str
    chain: str
    run_id: str
    confirmed: bool = False  # Temporal said this run is running (activities.runs)


def _stale(conn: Connection, conv: str, w: Writer, slots: range,
           horizon: int | None) -> list[int]:
    """Slots holding rows of another run of the writer's turn that it replaces."""
    where = []
    params: dict[str, Any] = {"c": conv, "wf": w.workflow_id, "chain": w.chain, "run": w.run_id}
    # `seq + 0`, and no ORDER BY: the rows are found through the writer's index
    # (the turn's own rows), never by walking the conversation's primary key
    # from the horizon (SQLite chose that: O(conversation) per write).
    if horizon is not None:
        where.append("seq + 0 >= :h")
        params["h"] = horizon
    if len(slots):
        where.append("seq + 0 BETWEEN :lo AND :hi")
        params.update(lo=slots[0], hi=slots[-1])
    if not where:
        return []
    rows = conn.fetchall(
        "SELECT seq FROM chat_message WHERE conversation_id = :c AND workflow_id = :wf "
        "AND COALESCE(execution_chain, '') = :chain AND run_id IS NOT NULL AND run_id <> :run "
        f"AND ({' OR '.join(where)})", params)
    return sorted(int(r["seq"]) for r in rows)


def claim(conn: Connection, conv: str, w: Writer, slots: range = range(0),
          horizon: int | None = None) -> list[int]:
    """Make `w`'s run the one writing `conv` now (see the module's doc), in the
    caller's transaction. Returns the slots whose rows it superseded.
    Raises RunUnconfirmed, MemoryConflictError, ResetConflict."""
    lock = conn.fetchone("SELECT workflow_id, run_id FROM conversation_lock "
                         "WHERE conversation_id = :c", {"c": conv})
    stale = _stale(conn, conv, w, slots, horizon)
    if lock is not None and lock["workflow_id"] != w.workflow_id:
        holder = lock["workflow_id"]
        if stale:
            raise ResetConflict(f"conversation {conv!r} is held by turn {holder}: this reset "
                                f"run of {w.workflow_id} cannot take its messages back")
        raise MemoryConflictError(f"conversation {conv!r} is held by turn {holder}; turns of "
                                  "one conversation must not interleave")
    mine = lock is not None and lock["run_id"] == w.run_id
    if (stale or not mine) and not w.confirmed:
        raise RunUnconfirmed(f"run {w.run_id} of {w.workflow_id} would take an earlier "
                             "run's place in the conversation")
    if stale:
        later = conn.fetchone(
            "SELECT workflow_id FROM chat_message WHERE conversation_id = :c AND seq > :s "
            "AND NOT (COALESCE(workflow_id, '') = :wf AND COALESCE(execution_chain, '') = "
            ":chain) ORDER BY seq LIMIT 1",
            {"c": conv, "s": stale[0], "wf": w.workflow_id, "chain": w.chain})
        if later is not None:
            raise ResetConflict(
                f"conversation {conv!r} went on after turn {w.workflow_id} (turn "
                f"{later['workflow_id']} wrote after it): a reset of {w.workflow_id} cannot "
                "take those messages back; reset the latest turn or start a new one")
        _move(conn, conv, stale, w.run_id)
    if not mine:
        _hold(conn, conv, w, lock)
    return stale


def _hold(conn: Connection, conv: str, w: Writer, lock: dict[str, Any] | None) -> None:
    """The confirmed current run of the turn takes the lock: from an earlier
    run of its turn, or free."""
    params = {"c": conv, "wf": w.workflow_id, "run": w.run_id, "chain": w.chain or None,
              "now": now_iso()}
    if lock is None:
        conn.execute("INSERT INTO conversation_lock (conversation_id, workflow_id, run_id, "
                     "acquired_at, execution_chain) VALUES (:c, :wf, :run, :now, :chain) "
                     "ON CONFLICT (conversation_id) DO NOTHING", params)
    else:
        conn.execute("UPDATE conversation_lock SET run_id = :run, execution_chain = :chain, "
                     "acquired_at = :now WHERE conversation_id = :c AND workflow_id = :wf "
                     "AND run_id = :old", {**params, "old": lock["run_id"]})
    held = conn.fetchone("SELECT workflow_id, run_id FROM conversation_lock "
                         "WHERE conversation_id = :c", {"c": conv})
    if held is None or (held["workflow_id"], held["run_id"]) != (w.workflow_id, w.run_id):
        raise MemoryConflictError(f"conversation {conv!r} was taken by turn "
                                  f"{held['workflow_id'] if held else '?'} meanwhile")


def _move(conn: Connection, conv: str, seqs: list[int], by: str) -> None:
    """Supersede the rows at `seqs`: copy them (and their images) into
    `superseded_message`, then remove them from memory."""
    now = now_iso()
    for seq in seqs:
        row = conn.fetchone("SELECT * FROM chat_message WHERE conversation_id = :c "
                            "AND seq = :s", {"c": conv, "s": seq})
        if row is None:
            continue
        parts = conn.fetchall("SELECT idx, type, url, data, mime_type FROM chat_message_part "
                              "WHERE conversation_id = :c AND seq = :s ORDER BY idx",
                              {"c": conv, "s": seq})
        attrs = json.loads(row["attributes"]) if row["attributes"] else {}
        # Only tool calls and results have effects to look at (superseded.settle).
        open_ = (row["role"] == "tool" or (row["role"] == "assistant" and row["tool_calls"]
                                            and not attrs.get(attr.DISCARDED)))
        conn.execute(
            f"INSERT INTO superseded_message ({', '.join(_COLUMNS)}, parts, superseded_by, "
            f"superseded_at, settled_at) VALUES ({', '.join(':' + c for c in _COLUMNS)}, "
            ":parts, :by, :now, :settled)",
            {**{c: row[c] for c in _COLUMNS}, "is_error": bool(row["is_error"]),
             "parts": json.dumps(parts) if parts else None, "by": by, "now": now,
             "settled": None if open_ else now})
        conn.execute("DELETE FROM chat_message_part WHERE conversation_id = :c AND seq = :s",
                     {"c": conv, "s": seq})
        conn.execute("DELETE FROM chat_message WHERE conversation_id = :c AND seq = :s",
                     {"c": conv, "s": seq})
    if seqs:
        lower_answered_through(conn, conv, min(seqs))


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
