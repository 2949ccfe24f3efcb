"""Multimodal parts of stored messages (step 6), in their own table.

`chat_message` stays exactly as docs/contract.md describes it (a row inserted by
another program is still a valid message); a message's images live in
`chat_message_part`, keyed by the message's (conversation_id, seq), and are
joined back when memory is read.
"""

from __future__ import annotations

from collections import defaultdict

import sqlalchemy as sa

from turnstile.engine.messages import Attachment
from turnstile.stores.db import Connection, metadata

chat_message_part = sa.Table(
    "chat_message_part", metadata,
    sa.Column("conversation_id", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("url", sa.Text),
    sa.Column("data", sa.Text),
    sa.Column("mime_type", sa.Text),
)


def write_parts(conn: Connection, conversation_id: str, seq: int,
                parts: list[Attachment]) -> None:
    """Idempotent: a retried memory write finds its parts already there."""
    for idx, p in enumerate(parts):
        conn.execute(
            "INSERT INTO chat_message_part (conversation_id, seq, idx, type, url, data, "
            "mime_type) VALUES (:c, :seq, :idx, :type, :url, :data, :mime_type) "
            "ON CONFLICT (conversation_id, seq, idx) DO NOTHING",
            {"c": conversation_id, "seq": seq, "idx": idx, "type": p.type, "url": p.url,
             "data": p.data, "mime_type": p.mime_type})


def read_parts(conn: Connection, conversation_id: str,
               since: int = 0) -> dict[int, list[Attachment]]:
    """Images of the messages at `since` and after."""
    rows = conn.fetchall(
        "SELECT seq, type, url, data, mime_type FROM chat_message_part "
        "WHERE conversation_id = :c AND seq >= :since ORDER BY seq, idx",
        {"c": conversation_id, "since": since})
    out: dict[int, list[Attachment]] = defaultdict(list)
    for r in rows:
        out[int(r["seq"])].append(Attachment(type=r["type"], url=r["url"], data=r["data"],
                                             mime_type=r["mime_type"]))
    return out
