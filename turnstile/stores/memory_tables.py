"""The tables of chat memory (turnstile.stores.memory, their one writer),
and the reads every model call and memory write of a turn makes, built
once with their values bound at execution: building a SELECT
(coercions, cache keys) cost several times running it (bench/micro.py
memory)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from turnstile.stores.prebuilt import prebuilt
from turnstile.stores.tables import FLAG_FALSE, Flag, metadata, text_columns

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


def message_columns() -> list[sa.Column[Any]]:
    """The columns of a stored message, in chat_message and (kept for the
    record) superseded_message."""
    return [sa.Column("role", sa.Text, nullable=False),
            *text_columns("content", "tool_calls", "tool_call_id", nullable=True),
            sa.Column("is_error", Flag, nullable=False, server_default=FLAG_FALSE),
            sa.Column("attributes", sa.Text)]


chat_message = sa.Table(
    "chat_message", metadata,
    sa.Column("conversation_id", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    *message_columns(),
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
m = chat_message.c
cv = conversation.c

# Damaged rows (turnstile.stores.damage) an operator set aside with
# `starter.py conversation quarantine` (their one writer:
# turnstile.stores.quarantine): the row as it was, copied by the database
# (text that is not UTF-8 stays as its bytes), with who, when and why
# (migration 0012). Out of chat_message, so out of every window; kept.
quarantined_message = sa.Table(
    "quarantined_message", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("conversation_id", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),  # the slot it had in chat_message
    *text_columns("role", "content", "tool_calls", "tool_call_id", nullable=True),
    sa.Column("is_error", Flag),
    *text_columns("attributes", "created_at", "workflow_id", "execution_chain", "run_id",
                  nullable=True),
    # Its chat_message_part rows (images), as a JSON list; bytes that are not
    # UTF-8 as {"bytes_hex": ...}.
    sa.Column("parts", sa.Text),
    *text_columns("quarantined_by", "quarantined_at", "reason"),
    sa.Index("quarantined_message_conversation", "conversation_id", "seq"),
)
QUARANTINED_COLUMNS = ("conversation_id", "seq", "role", "content", "tool_calls",
                       "tool_call_id", "is_error", "attributes", "created_at", "workflow_id",
                       "execution_chain", "run_id")

_conv = m.conversation_id == sa.bindparam("conv")
_slot = sa.and_(_conv, m.seq == sa.bindparam("seq"))

# Reads; values: conv (and seq, n as named). Memory's writes stay in
# turnstile.stores.memory, each table's one writer (tests/test_one_writer.py).
GET = prebuilt(sa.select(chat_message).where(_slot))
SLOT_WRITER = prebuilt(sa.select(m.workflow_id, m.run_id).where(_slot))
OWNER = prebuilt(sa.select(cv.user_id).where(cv.conversation_id == sa.bindparam("conv")))
LAST_SEQ = prebuilt(sa.select(sa.func.max(m.seq)).where(_conv))
SYSTEM_PROMPT = prebuilt(sa.select(m.conversation_id, m.seq, m.content)
                         .where(_conv, m.role == "system").order_by(m.seq.desc()).limit(1))
NEWEST_SYSTEM = (sa.select(chat_message).where(_conv, m.role == "system")
                 .order_by(m.seq.desc()).limit(1))
OTHERS = sa.select(chat_message).where(_conv, m.role != "system").order_by(m.seq.desc())
NEWEST_OTHERS = OTHERS.limit(sa.bindparam("n", type_=sa.Integer))
# Both, in one round trip (MemoryStore.tail; each as a subquery: SQLite takes
# no ORDER BY or LIMIT in a member of a compound SELECT).
NEWEST_PAGE = prebuilt(sa.union_all(sa.select(NEWEST_SYSTEM.subquery()),
                                    sa.select(NEWEST_OTHERS.subquery())))
