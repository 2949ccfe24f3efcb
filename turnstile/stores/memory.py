"""Chat memory, outside workflow history (the per-call tool ledger:
turnstile.stores.ledger).

Memory is keyed by conversation and bound to the user who opened it. Every
write names the slot (`seq`) the workflow assigned, so a retried activity
rewrites the same slot instead of appending twice: an insert that finds its
slot taken by the same turn is a no-op, one that finds another writer there is
a `MemoryConflictError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import MemorySnapshot
from turnstile.engine.errors import ConversationOwnershipError, MemoryConflictError
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.stores.db import FLAG_FALSE, Connection, Database, Flag, metadata
from turnstile.stores.message_parts import read_parts, write_parts


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


conversation = sa.Table(
    "conversation", metadata,
    sa.Column("conversation_id", sa.Text, primary_key=True),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    # Every tool call at a slot up to this one has its result (migration 0007):
    # the orphan repair reads only what lies after it. NULL: read from the start.
    sa.Column("answered_through", sa.BigInteger),
)

# Tool results that carry cross-round state: the rows `state()` reads, indexed
# by a partial index (its WHERE is the query's, word for word).
STATEFUL = "role = 'tool' AND attributes LIKE '%\"turnstile.state\"%'"

chat_message = sa.Table(
    "chat_message", metadata,
    sa.Column("conversation_id", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("content", sa.Text),
    sa.Column("tool_calls", sa.Text),
    sa.Column("tool_call_id", sa.Text),
    sa.Column("is_error", Flag, nullable=False, server_default=FLAG_FALSE),
    sa.Column("attributes", sa.Text),
    sa.Column("created_at", sa.Text),
    sa.Column("workflow_id", sa.Text),
    sa.Column("execution_chain", sa.Text),  # the writing turn's chain (migration 0005)
    sa.Column("run_id", sa.Text),  # the writing run (0006; turnstile.stores.runs)
    sa.Index("chat_message_call", "conversation_id", "tool_call_id"),
    sa.Index("chat_message_writer", "conversation_id", "workflow_id"),
    # The newest system message, and messages by role (migration 0007).
    sa.Index("chat_message_role", "conversation_id", "role", "seq"),
    sa.Index("chat_message_state", "conversation_id", "seq",
             sqlite_where=sa.text(STATEFUL), postgresql_where=sa.text(STATEFUL)),
)

def _row_to_message(row: dict[str, Any]) -> ChatMessage:
    calls = json.loads(row["tool_calls"]) if row.get("tool_calls") else []
    return ChatMessage(
        role=row["role"],
        content=row.get("content"),
        tool_calls=[ToolCall.model_validate(c) for c in calls],
        tool_call_id=row.get("tool_call_id"),
        is_error=bool(row.get("is_error") or False),
        attributes=json.loads(row["attributes"]) if row.get("attributes") else {},
    )


def lower_answered_through(conn: Connection, conversation_id: str, seq: int) -> None:
    """A row written or removed at `seq`: the repair must read from there again
    (`conversation.answered_through`, turnstile.stores.journal)."""
    conn.execute("UPDATE conversation SET answered_through = :s WHERE conversation_id = :c "
                 "AND answered_through >= :s", {"c": conversation_id, "s": seq - 1})


def _assembled(rows: list[dict[str, Any]], parts: dict[int, list[Any]],
               workflow_id: str | None) -> list[ChatMessage]:
    """Rows in `seq` order as a model reads them (see `MemoryStore.messages`)."""
    msgs = []
    for r in rows:
        m = _row_to_message(r)
        if m.attributes.get(attr.DISCARDED):
            continue
        augmented = m.attributes.get(attr.AUGMENTED_USER_MESSAGE)
        if augmented and workflow_id is not None and r.get("workflow_id") == workflow_id:
            m.content = augmented
        m.parts = parts.get(int(r["seq"]), [])
        msgs.append(m)
    systems = [m for m in msgs if m.role == "system"]
    return systems[-1:] + [m for m in msgs if m.role != "system"]


class MemoryStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- ownership ----------------------------------------------------------
    def bind(self, conn: Connection, conversation_id: str, user_id: str) -> None:
        """Bind a new conversation to its user; refuse anyone else's turn on it."""
        conn.execute(
            "INSERT INTO conversation (conversation_id, user_id, created_at)"
            " VALUES (:conversation_id, :user_id, :now) ON CONFLICT (conversation_id) DO NOTHING",
            {"conversation_id": conversation_id, "user_id": user_id, "now": now_iso()},
        )
        owner = conn.fetchone(
            "SELECT user_id FROM conversation WHERE conversation_id = :c", {"c": conversation_id}
        )
        if owner is None or owner["user_id"] != user_id:
            raise ConversationOwnershipError(
                f"conversation {conversation_id!r} belongs to another user; "
                "start a new conversation id"
            )

    # -- reads --------------------------------------------------------------
    def check_owner(self, conversation_id: str, user_id: str) -> None:
        with self.db.connect() as conn:
            self.bind(conn, conversation_id, user_id)

    def snapshot(self, conversation_id: str, user_id: str,
                 conn: Connection | None = None) -> MemorySnapshot:
        with self.db.joined(conn) as conn:
            self.bind(conn, conversation_id, user_id)
            stats = conn.fetchone(  # MAX over the primary key: one index probe
                "SELECT MAX(seq) AS last FROM chat_message WHERE conversation_id = :c",
                {"c": conversation_id},
            ) or {"last": None}
            system = conn.fetchone(
                "SELECT content FROM chat_message WHERE conversation_id = :c AND role = 'system' "
                "ORDER BY seq DESC LIMIT 1",
                {"c": conversation_id},
            )
        last = stats["last"]
        return MemorySnapshot(
            next_seq=0 if last is None else int(last) + 1,
            message_count=0 if last is None else int(last) + 1,  # slots used
            system_prompt=system["content"] if system else None,
        )

    @contextmanager
    def _in(self, conn: Connection | None) -> Iterator[Connection]:
        """`conn` (the caller's transaction), or a transaction of our own."""
        if conn is not None:
            yield conn
        else:
            with self.db.connect() as own:
                yield own

    def messages(self, conversation_id: str, workflow_id: str | None = None,
                 conn: Connection | None = None) -> list[ChatMessage]:
        """The conversation as a model should read it: the latest system
        message first, then every other message in `seq` order, with its
        images. Answers the output guardrails discarded are left out; a user
        message stored without its retrieved text (retrieval memory
        "original") gets that text back for the turn `workflow_id` only."""
        with self._in(conn) as conn:
            rows = conn.fetchall(
                "SELECT * FROM chat_message WHERE conversation_id = :c ORDER BY seq",
                {"c": conversation_id},
            )
            parts = read_parts(conn, conversation_id)
        return _assembled(rows, parts, workflow_id)

    def tail(self, conversation_id: str, workflow_id: str | None,
             enough: Callable[[list[ChatMessage]], bool], conn: Connection | None = None,
             first_page: int = 64) -> list[ChatMessage]:
        """The newest part of `messages()` that a bounded window needs: pages
        of rows read newest first until `enough` says the window is full
        before the oldest page (then `messages()` would give the same window),
        or the conversation's start. A page never ends inside a group of a
        call and its results; the newest user message is always read."""
        with self._in(conn) as conn:
            system = conn.fetchall(
                "SELECT * FROM chat_message WHERE conversation_id = :c AND role = 'system' "
                "ORDER BY seq DESC LIMIT 1", {"c": conversation_id})
            # The newest page, then ranges of slots below it: a range of the
            # primary key is planned well everywhere (PostgreSQL, with stale
            # statistics, read "seq < b ORDER BY seq DESC LIMIT n" by a bitmap
            # scan of the whole conversation).
            rows = conn.fetchall(
                "SELECT * FROM chat_message WHERE conversation_id = :c AND role <> 'system' "
                "ORDER BY seq DESC LIMIT :n", {"c": conversation_id, "n": first_page})
            low = int(rows[-1]["seq"]) if len(rows) == first_page else 0
            page = first_page * 4
            while low > 0:  # 0: the conversation's start was read
                oldest = rows[-1]
                if (oldest["role"] != "tool" and any(r["role"] == "user" for r in rows)
                        and enough(_assembled(system + rows[::-1], {}, workflow_id))):
                    break
                start = max(0, low - page)
                rows.extend(conn.fetchall(
                    "SELECT * FROM chat_message WHERE conversation_id = :c AND seq >= :lo "
                    "AND seq < :hi AND role <> 'system' ORDER BY seq DESC",
                    {"c": conversation_id, "lo": start, "hi": low}))
                low, page = start, page * 4
            since = int(rows[-1]["seq"]) if rows else 0
            parts = read_parts(conn, conversation_id, since=since)
        return _assembled(system + rows[::-1], parts, workflow_id)

    def state(self, conversation_id: str) -> dict[str, Any]:
        """Cross-round state: `turnstile.state` of every tool result that was not
        rolled back, merged in `seq` order (later values win). Reads only the
        results that carry state (index chat_message_state)."""
        merged: dict[str, Any] = {}
        with self.db.connect() as conn:
            # SQLite without statistics prefers chat_message_role (all tool results).
            hint = " INDEXED BY chat_message_state" if conn.dialect == "sqlite" else ""
            rows = conn.fetchall(
                f"SELECT attributes FROM chat_message{hint} WHERE conversation_id = :c "
                f"AND {STATEFUL} ORDER BY seq", {"c": conversation_id})
        for r in rows:
            attrs = json.loads(r["attributes"]) if r["attributes"] else {}
            if not attrs.get(attr.ROLLED_BACK) and not attrs.get(attr.DISCARDED):
                merged.update(attrs.get(attr.STATE) or {})
        return merged

    def get(self, conversation_id: str, seq: int, conn: Connection | None = None
            ) -> tuple[ChatMessage, str | None, str | None] | None:
        """The message at `seq`, the turn and the run that wrote it."""
        with self._in(conn) as conn:
            row = conn.fetchone(
                "SELECT * FROM chat_message WHERE conversation_id = :c AND seq = :seq",
                {"c": conversation_id, "seq": seq},
            )
        return None if row is None else (_row_to_message(row), row.get("workflow_id"),
                                         row.get("run_id"))

    # -- writes -------------------------------------------------------------
    def put(
        self, conversation_id: str, seq: int, message: ChatMessage, workflow_id: str,
        chain: str | None = None,
    ) -> None:
        self.append(conversation_id, seq, [message], workflow_id, chain)

    def append(
        self, conversation_id: str, start_seq: int, messages: list[ChatMessage], workflow_id: str,
        chain: str | None = None,
    ) -> None:
        """`chain`: the writing turn's execution chain (None: not known, v0.1 callers)."""
        with self.db.connect() as conn:
            self.append_in(conn, conversation_id, start_seq, messages, workflow_id, chain)

    def append_in(
        self, conn: Connection, conversation_id: str, start_seq: int,
        messages: list[ChatMessage], workflow_id: str, chain: str | None = None,
        run_id: str | None = None,
    ) -> None:
        """`append` inside the caller's transaction. `run_id`: the writing run
        (a run-aware writer claims its slots first: turnstile.stores.runs)."""
        for offset, m in enumerate(messages):
            seq = start_seq + offset
            cur = conn.execute(
                "INSERT INTO chat_message (conversation_id, seq, role, content, tool_calls, "
                "tool_call_id, is_error, attributes, created_at, workflow_id, "
                "execution_chain, run_id) "
                "VALUES (:conversation_id, :seq, :role, :content, :tool_calls, "
                ":tool_call_id, :is_error, :attributes, :created_at, :workflow_id, "
                ":execution_chain, :run_id) "
                "ON CONFLICT (conversation_id, seq) DO NOTHING",
                {
                    "conversation_id": conversation_id,
                    "seq": seq,
                    "role": m.role,
                    "content": m.content,
                    "tool_calls": (json.dumps([c.model_dump() for c in m.tool_calls])
                                   if m.tool_calls else None),
                    "tool_call_id": m.tool_call_id,
                    "is_error": m.is_error,
                    "attributes": json.dumps(m.attributes) if m.attributes else None,
                    "created_at": now_iso(),
                    "workflow_id": workflow_id,
                    "execution_chain": chain,
                    "run_id": run_id,
                },
            )
            if cur.rowcount == 1 and m.parts:
                write_parts(conn, conversation_id, seq, m.parts)
            if cur.rowcount == 0:
                owner = conn.fetchone(
                    "SELECT workflow_id, run_id FROM chat_message "
                    "WHERE conversation_id = :c AND seq = :seq",
                    {"c": conversation_id, "seq": seq},
                )
                # The same turn's retry is a no-op; another turn's row, or
                # another run's that no claim superseded, is a conflict.
                if owner is None or owner["workflow_id"] != workflow_id or (
                        run_id and owner["run_id"] and owner["run_id"] != run_id):
                    raise MemoryConflictError(
                        f"message slot {seq} of conversation {conversation_id!r} was "
                        "written by another writer; turns of one conversation must not "
                        "interleave"
                    )
        if messages:
            lower_answered_through(conn, conversation_id, start_seq)

    def discard(self, conversation_id: str, seq: int, reason: str) -> None:
        """Mark an answer the model must never be sent again (output guardrail
        retry); the row stays for the record. Idempotent."""
        with self.db.connect() as conn:
            row = conn.fetchone(
                "SELECT attributes FROM chat_message WHERE conversation_id = :c AND seq = :seq",
                {"c": conversation_id, "seq": seq})
            if row is None:
                return
            attrs = json.loads(row["attributes"]) if row["attributes"] else {}
            attrs[attr.DISCARDED] = reason
            conn.execute(
                "UPDATE chat_message SET attributes = :a WHERE conversation_id = :c AND seq = :seq",
                {"a": json.dumps(attrs), "c": conversation_id, "seq": seq})

    def rewrite_tool_result(
        self,
        conversation_id: str,
        tool_call_id: str,
        content: str,
        extra_attributes: dict[str, Any],
        *,
        workflow_id: str | None = None,
        chain: str = "",
        conn: Connection | None = None,
    ) -> int:
        """Replace what the model remembers of a call (saga rollback). With
        `workflow_id`, only the result that turn (and execution chain) wrote:
        provider call ids repeat across turns, a rollback never touches another
        turn's result."""
        query = ("SELECT seq, attributes FROM chat_message WHERE conversation_id = :c "
                 "AND tool_call_id = :call AND role = 'tool'")
        params: dict[str, Any] = {"c": conversation_id, "call": tool_call_id}
        if workflow_id is not None:
            query += " AND workflow_id = :wf AND COALESCE(execution_chain, '') = :chain"
            params.update(wf=workflow_id, chain=chain)
        with self.db.joined(conn) as conn:
            rows = conn.fetchall(query, params)
            for row in rows:
                attrs = json.loads(row["attributes"]) if row["attributes"] else {}
                attrs.update(extra_attributes)
                conn.execute(
                    "UPDATE chat_message SET content = :content, is_error = :is_error, "
                    "attributes = :a WHERE conversation_id = :c AND seq = :seq",
                    {"content": content, "is_error": True, "a": json.dumps(attrs),
                     "c": conversation_id, "seq": row["seq"]},
                )
            return len(rows)
