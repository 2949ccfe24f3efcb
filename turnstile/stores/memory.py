"""Chat memory, outside workflow history (the per-call tool ledger:
turnstile.stores.ledger).

Memory is keyed by conversation and bound to the user who opened it. Every
write names the slot (`seq`) the workflow assigned, so a retried activity
rewrites the same slot instead of appending twice: an insert that finds its
slot taken by the same turn is a no-op, one that finds another writer there is
a `MemoryConflictError`.

This module is the one writer of `conversation` and `chat_message` (the
images of a message: turnstile.stores.message_parts); others read them, and
change them through its functions (a reset run's supersession: `remove`; the
orphan repair's watermark: `mark_answered_through`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import sqlalchemy as sa

from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import MemorySnapshot
from turnstile.engine.errors import ConversationOwnershipError, DamagedRow, MemoryConflictError
from turnstile.engine.messages import Attachment, ChatMessage, Role, ToolCall
from turnstile.stores.connection import Connection
from turnstile.stores.damage import check_row, looks_sound, shown
from turnstile.stores.db import Database
from turnstile.stores.memory_tables import (
    GET,
    LAST_SEQ,
    NEWEST_PAGE,
    OTHERS,
    OWNER,
    SLOT_WRITER,
    STATEFUL as STATEFUL,
    SYSTEM_PROMPT,
    chat_message as chat_message,
    conversation as conversation,
    cv,
    m,
    message_columns as message_columns,
)
from turnstile.stores.message_parts import delete_parts, read_parts, write_parts
from turnstile.stores.prebuilt import prebuilt
from turnstile.stores.tables import stored_time


def now_iso() -> str:
    return stored_time(datetime.now(UTC))




def load_attributes(text: str | None) -> dict[str, Any]:
    """A stored `attributes` column (JSON text or NULL) as a dict."""
    return json.loads(text) if text else {}


class MessageRow(NamedTuple):
    """A `chat_message` row as stored (`sa.select(chat_message)`)."""

    conversation_id: str
    seq: int
    role: Role  # as stored; ChatMessage validates it
    content: str | None = None
    tool_calls: str | None = None  # JSON list of ToolCall
    tool_call_id: str | None = None
    is_error: int = 0  # INTEGER 0/1 on SQLite, BOOLEAN on PostgreSQL
    attributes: str | None = None  # JSON object
    created_at: str | None = None
    workflow_id: str | None = None
    execution_chain: str | None = None
    run_id: str | None = None

    def message(self) -> ChatMessage:
        """The stored message; `DamagedRow` when the row cannot be read as
        one (turnstile.stores.damage: parsed once, judged by the whole rule
        only when parsing fails or a glance finds something)."""
        try:
            calls = json.loads(self.tool_calls) if self.tool_calls else []
            attrs = load_attributes(self.attributes)
            msg = ChatMessage(role=self.role, content=self.content,
                              tool_calls=[ToolCall.model_validate(c) for c in calls],
                              tool_call_id=self.tool_call_id, is_error=bool(self.is_error),
                              attributes=attrs)
        except (ValueError, TypeError, AttributeError, RecursionError):
            check_row(self._asdict())  # names the row; else the error stands (UnreadableData)
            raise
        texts = (self.content, self.tool_call_id, self.created_at, self.workflow_id,
                 self.execution_chain, self.run_id)
        if type(calls) is not list or not looks_sound(self.is_error, texts, (
                self.tool_calls, self.attributes), msg.attributes):
            check_row(self._asdict())
        return msg


class SystemPrompt(NamedTuple):
    conversation_id: str
    seq: int
    content: str | None


class SlotWriter(NamedTuple):
    """Who wrote a memory slot (NULL in rows other programs wrote)."""

    workflow_id: str | None = None
    run_id: str | None = None


class SlotState(NamedTuple):
    conversation_id: str
    seq: int
    attributes: str | None


class SlotAttributes(NamedTuple):
    seq: int
    attributes: str | None


def _slot(conversation_id: str, seq: int) -> sa.ColumnElement[bool]:
    return sa.and_(m.conversation_id == conversation_id, m.seq == seq)


# Built once: every memory write makes it (values bound at execution).
_LOWER_ANSWERED = prebuilt(sa.update(conversation)
                   .where(cv.conversation_id == sa.bindparam("conv"),
                          cv.answered_through >= sa.bindparam("through"))
                   .values(answered_through=sa.bindparam("through")))


def lower_answered_through(conn: Connection, conversation_id: str, seq: int) -> None:
    """A row written or removed at `seq`: the repair must read from there again
    (`conversation.answered_through`, turnstile.stores.journal)."""
    conn.changed(_LOWER_ANSWERED, {"conv": conversation_id, "through": seq - 1})


def mark_answered_through(conn: Connection, conversation_id: str, seq: int) -> None:
    """Every call through `seq` has its result now (the orphan repair)."""
    conn.execute(sa.update(conversation).where(cv.conversation_id == conversation_id)
                 .values(answered_through=seq))


def rows_at(conn: Connection, conversation_id: str, seqs: Sequence[int]) -> list[MessageRow]:
    """The rows at `seqs`, in `seq` order."""
    return conn.rows(sa.select(chat_message).where(
        m.conversation_id == conversation_id, m.seq.in_(seqs)).order_by(m.seq), MessageRow)


def remove(conn: Connection, conversation_id: str, seqs: Sequence[int]) -> None:
    """Take the rows at `seqs`, with their images, out of memory (a reset run
    superseded them; turnstile.stores.runs keeps them for the record)."""
    if not seqs:
        return
    delete_parts(conn, conversation_id, seqs)
    conn.execute(sa.delete(chat_message).where(m.conversation_id == conversation_id,
                                               m.seq.in_(seqs)))
    lower_answered_through(conn, conversation_id, min(seqs))


def _assembled(rows: list[MessageRow], parts: dict[int, list[Attachment]],
               workflow_id: str | None) -> list[ChatMessage]:
    """Rows in `seq` order as a model reads them (see `MemoryStore.messages`)."""
    msgs = []
    for r in rows:
        msg = r.message()
        if msg.attributes.get(attr.DISCARDED):
            continue
        augmented = msg.attributes.get(attr.AUGMENTED_USER_MESSAGE)
        if augmented and workflow_id is not None and r.workflow_id == workflow_id:
            msg.content = augmented
        msg.parts = parts.get(int(r.seq), [])
        msgs.append(msg)
    systems = [msg for msg in msgs if msg.role == "system"]
    return systems[-1:] + [msg for msg in msgs if msg.role != "system"]


class MemoryStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- ownership ----------------------------------------------------------
    def bind(self, conn: Connection, conversation_id: str, user_id: str) -> None:
        """Bind a new conversation to its user; refuse anyone else's turn on it."""
        if conn.insert_new(conversation, {"conversation_id": conversation_id,
                                          "user_id": user_id, "created_at": now_iso()}):
            return  # new: bound to this user now (no read of what was just written)
        try:
            owner = conn.scalar(OWNER, str, {"conv": conversation_id})
        except DamagedRow as err:  # its owner cannot be read: named, not retried
            raise DamagedRow(shown(conversation_id), None, err.what, "conversation") from None
        if owner != user_id:
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
        mine = {"conv": conversation_id}
        with self.db.joined(conn) as conn:
            self.bind(conn, conversation_id, user_id)
            last = conn.scalar(LAST_SEQ, int, mine)  # MAX over the primary key: one probe
            system = conn.row(SYSTEM_PROMPT, SystemPrompt, mine)
        if system is not None:
            check_row(system._asdict())
        return MemorySnapshot(
            next_seq=0 if last is None else last + 1,
            message_count=0 if last is None else last + 1,  # slots used
            system_prompt=None if system is None else system.content,
        )

    def messages(self, conversation_id: str, workflow_id: str | None = None,
                 conn: Connection | None = None) -> list[ChatMessage]:
        """The conversation as a model should read it: the latest system
        message first, then every other message in `seq` order, with its
        images. Answers the output guardrails discarded are left out; a user
        message stored without its retrieved text (retrieval memory
        "original") gets that text back for the turn `workflow_id` only."""
        with self.db.joined(conn) as conn:
            rows = conn.rows(sa.select(chat_message).where(m.conversation_id == conversation_id)
                             .order_by(m.seq), MessageRow)
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
        mine = {"conv": conversation_id}
        with self.db.joined(conn) as conn:
            # The newest system message and the newest page of the others, in
            # one statement; then ranges of slots below it: a range of the
            # primary key is planned well everywhere (PostgreSQL, with stale
            # statistics, read "seq < b ORDER BY seq DESC LIMIT n" by a bitmap
            # scan of the whole conversation).
            newest = conn.rows(NEWEST_PAGE, MessageRow, {**mine, "n": first_page})
            system = [r for r in newest if r.role == "system"]
            rows = sorted((r for r in newest if r.role != "system"),
                          key=lambda r: int(r.seq), reverse=True)
            low = int(rows[-1].seq) if len(rows) == first_page else 0
            page = first_page * 4
            while low > 0:  # 0: the conversation's start was read
                if (rows[-1].role != "tool" and any(r.role == "user" for r in rows)
                        and enough(_assembled(system + rows[::-1], {}, workflow_id))):
                    break
                start = max(0, low - page)
                rows.extend(conn.rows(OTHERS.where(m.seq >= start, m.seq < low), MessageRow,
                                      mine))
                low, page = start, page * 4
            since = int(rows[-1].seq) if rows else 0
            parts = read_parts(conn, conversation_id, since=since)
        return _assembled(system + rows[::-1], parts, workflow_id)

    def state(self, conversation_id: str) -> dict[str, Any]:
        """Cross-round state: `turnstile.state` of every tool result that was not
        rolled back, merged in `seq` order (later values win). Reads only the
        results that carry state (index chat_message_state)."""
        merged: dict[str, Any] = {}
        with self.db.connect() as conn:
            # SQLite without statistics prefers chat_message_role (all tool
            # results); SQLAlchemy renders no index hint for SQLite, so that
            # FROM is text (and the columns are named without their table).
            source = (sa.text("chat_message INDEXED BY chat_message_state")
                      if conn.dialect == "sqlite" else chat_message)
            found = conn.rows(
                sa.select(sa.column("conversation_id"), sa.column("seq"),
                          sa.column("attributes")).select_from(source)
                .where(sa.column("conversation_id") == conversation_id, sa.text(STATEFUL))
                .order_by(sa.column("seq")), SlotState)
        for row in found:
            check_row(row._asdict())
            attrs = load_attributes(row.attributes)
            if not attrs.get(attr.ROLLED_BACK) and not attrs.get(attr.DISCARDED):
                merged.update(attrs.get(attr.STATE) or {})
        return merged

    def get(self, conversation_id: str, seq: int, conn: Connection | None = None
            ) -> tuple[ChatMessage, str | None, str | None] | None:
        """The message at `seq`, the turn and the run that wrote it."""
        with self.db.joined(conn) as conn:
            row = conn.row(GET, MessageRow, {"conv": conversation_id, "seq": seq})
        return None if row is None else (row.message(), row.workflow_id, row.run_id)

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
        for offset, msg in enumerate(messages):
            seq = start_seq + offset
            inserted = conn.insert_new(chat_message, {
                "conversation_id": conversation_id,
                "seq": seq,
                "role": msg.role,
                "content": msg.content,
                "tool_calls": (json.dumps([c.model_dump() for c in msg.tool_calls])
                               if msg.tool_calls else None),
                "tool_call_id": msg.tool_call_id,
                "is_error": msg.is_error,
                "attributes": json.dumps(msg.attributes) if msg.attributes else None,
                "created_at": now_iso(),
                "workflow_id": workflow_id,
                "execution_chain": chain,
                "run_id": run_id,
            })
            if inserted:
                if msg.parts:
                    write_parts(conn, conversation_id, seq, msg.parts)
                continue
            owner = conn.row(SLOT_WRITER, SlotWriter, {"conv": conversation_id, "seq": seq})
            # The same turn's retry is a no-op; another turn's row, or
            # another run's that no claim superseded, is a conflict.
            if owner is None or owner.workflow_id != workflow_id or (
                    run_id and owner.run_id and owner.run_id != run_id):
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
            row = conn.row(sa.select(m.seq, m.attributes).where(_slot(conversation_id, seq)),
                           SlotAttributes)
            if row is not None:
                self._set_attributes(conn, conversation_id, row, {attr.DISCARDED: reason})

    @staticmethod
    def _set_attributes(conn: Connection, conversation_id: str, row: SlotAttributes,
                        extra: dict[str, Any], **values: Any) -> None:
        attrs = load_attributes(row.attributes) | extra
        conn.execute(sa.update(chat_message).where(_slot(conversation_id, row.seq))
                     .values(attributes=json.dumps(attrs), **values))

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
        query = sa.select(m.seq, m.attributes).where(
            m.conversation_id == conversation_id, m.tool_call_id == tool_call_id,
            m.role == "tool")
        if workflow_id is not None:
            query = query.where(m.workflow_id == workflow_id,
                                sa.func.coalesce(m.execution_chain, "") == chain)
        with self.db.joined(conn) as conn:
            rows = conn.rows(query, SlotAttributes)
            for row in rows:
                self._set_attributes(conn, conversation_id, row, extra_attributes,
                                     content=content, is_error=True)
            return len(rows)
