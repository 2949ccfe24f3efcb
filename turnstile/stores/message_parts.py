"""Multimodal parts of stored messages (step 6), in their own table.

`chat_message` stays exactly as docs/contract.md describes it (a row inserted by
another program is still a valid message); a message's images live in
`chat_message_part`, keyed by the message's (conversation_id, seq), and are
joined back when memory is read. This module is the table's one writer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

import sqlalchemy as sa

from turnstile.engine.messages import Attachment
from turnstile.stores.connection import Connection
from turnstile.stores.damage import check_part
from turnstile.stores.prebuilt import prebuilt
from turnstile.stores.tables import metadata, text_columns

chat_message_part = sa.Table(
    "chat_message_part", metadata,
    sa.Column("conversation_id", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("type", sa.Text, nullable=False),
    *text_columns("url", "data", "mime_type", nullable=True),
)
p = chat_message_part.c


class PartRow(NamedTuple):
    """A `chat_message_part` row of one message (`seq`: which message)."""

    seq: int
    idx: int
    type: str
    url: str | None
    data: str | None
    mime_type: str | None
    conversation_id: str | None = None  # selected to name a damaged row

    def attachment(self) -> Attachment:
        return Attachment(type=self.type, url=self.url, data=self.data, mime_type=self.mime_type)


def write_parts(conn: Connection, conversation_id: str, seq: int,
                parts: list[Attachment]) -> None:
    """Idempotent: a retried memory write finds its parts already there."""
    for idx, part in enumerate(parts):
        conn.insert_new(chat_message_part, {
            "conversation_id": conversation_id, "seq": seq, "idx": idx, "type": part.type,
            "url": part.url, "data": part.data, "mime_type": part.mime_type})


_PARTS = sa.select(p.seq, p.idx, p.type, p.url, p.data, p.mime_type,
                   p.conversation_id).order_by(p.seq, p.idx)
# Built once: every model call's window reads them (values bound at execution).
_PARTS_SINCE = prebuilt(_PARTS.where(p.conversation_id == sa.bindparam("conv"),
                                     p.seq >= sa.bindparam("since")))


def part_rows(conn: Connection, conversation_id: str, since: int = 0,
              only: int | None = None) -> list[PartRow]:
    """The parts of the messages at `since` and after (or of the one at
    `only`), in order."""
    if only is None:
        return conn.rows(_PARTS_SINCE, PartRow, {"conv": conversation_id, "since": since})
    return conn.rows(_PARTS.where(p.conversation_id == conversation_id, p.seq == only),
                     PartRow)


def read_parts(conn: Connection, conversation_id: str,
               since: int = 0) -> dict[int, list[Attachment]]:
    """Images of the messages at `since` and after."""
    out: dict[int, list[Attachment]] = defaultdict(list)
    for r in part_rows(conn, conversation_id, since):
        check_part(conversation_id, r._asdict())  # a damaged row is named, not retried
        out[int(r.seq)].append(r.attachment())
    return out


def delete_parts(conn: Connection, conversation_id: str, seqs: Sequence[int]) -> None:
    """Remove the parts of the messages at `seqs` (turnstile.stores.memory.remove)."""
    conn.execute(sa.delete(chat_message_part).where(p.conversation_id == conversation_id,
                                                    p.seq.in_(seqs)))
