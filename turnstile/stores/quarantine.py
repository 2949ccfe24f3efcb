"""Damaged rows of memory, found and set aside (turnstile.stores.damage holds
the rule; `python starter.py check` lists what `damaged_rows` finds, `python
starter.py conversation quarantine` calls `quarantine`).

This module is the one writer of `quarantined_message` (declared with the
other memory tables in turnstile.stores.memory_tables): a row set aside is
copied there by the database, bytes as they are, with who set it aside, when
and why, and leaves `chat_message` through memory's own `remove` (with its
images, kept as JSON in `parts`), so no window reads it again.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import sqlalchemy as sa

from turnstile.stores.damage import (
    Damage,
    damaged,
    kept_value,
    message_damage,
    part_damage,
    shown,
)
from turnstile.stores.db import Database
from turnstile.stores.memory import now_iso, remove
from turnstile.stores.memory_tables import (
    QUARANTINED_COLUMNS,
    chat_message,
    m,
    quarantined_message,
)
from turnstile.stores.message_parts import chat_message_part

part = chat_message_part.c


class NotDamaged(ValueError):
    """`quarantine` of a row that is not damaged (without `force`)."""


class Quarantined(NamedTuple):
    """A row set aside: where it was, who set it aside, when and why."""

    conversation_id: str
    seq: int
    by: str
    at: str
    reason: str


def damaged_rows(db: Database, conversation_id: str | None = None) -> list[Damage]:
    """Every damaged row of memory (of one conversation), in order: messages
    and their images, text that is not UTF-8 included (read tolerantly)."""
    mine = [m.conversation_id == conversation_id] if conversation_id else []
    theirs = [part.conversation_id == conversation_id] if conversation_id else []
    found: list[Damage] = []
    with db.connect() as conn, conn.tolerant():
        result = conn.execute(sa.select(chat_message).where(*mine)
                              .order_by(m.conversation_id, m.seq))
        names = list(result.keys())
        while batch := result.fetchmany(500):
            found += damaged([dict(zip(names, r, strict=True)) for r in batch])
        for row in conn.execute(sa.select(chat_message_part).where(*theirs)
                                .order_by(part.conversation_id, part.seq, part.idx)).mappings():
            problem = part_damage(dict(row))
            if problem is not None:
                found.append(Damage(shown(str(row["conversation_id"])), int(row["seq"]),
                                    problem))
    return sorted(found)


def quarantine(db: Database, conversation_id: str, seq: int, by: str, reason: str | None,
               force: bool = False) -> Quarantined:
    """Set the row at `seq` aside (see the module's doc). Refused
    (`NotDamaged`) for a row that is not damaged unless `force`;
    `LookupError` when there is no such row."""
    slot = sa.and_(m.conversation_id == conversation_id, m.seq == seq)
    with db.connect() as conn:
        with conn.tolerant():
            row = conn.execute(sa.select(chat_message).where(slot)).mappings().first()
            parts = [dict(r) for r in conn.execute(
                sa.select(chat_message_part).where(part.conversation_id == conversation_id,
                                                   part.seq == seq).order_by(part.idx)
            ).mappings()]
        if row is None:
            raise LookupError(f"conversation {shown(conversation_id)} has no row at seq {seq}")
        problem = message_damage(dict(row)) or next(
            (d for d in map(part_damage, parts) if d is not None), None)
        if problem is None and not force:
            raise NotDamaged(f"conversation {shown(conversation_id)} seq {seq} is not "
                             "damaged; nothing was set aside (--force sets it aside anyway)")
        why = reason or problem or "set aside by an operator"
        at = now_iso()
        kept = json.dumps([{k: kept_value(v) for k, v in p.items()
                            if k not in ("conversation_id", "seq")} for p in parts])
        extra = [sa.literal(kept if parts else None, sa.Text).label("parts"),
                 sa.literal(by, sa.Text).label("quarantined_by"),
                 sa.literal(at, sa.Text).label("quarantined_at"),
                 sa.literal(why, sa.Text).label("reason")]
        conn.execute(sa.insert(quarantined_message).from_select(
            [*QUARANTINED_COLUMNS, "parts", "quarantined_by", "quarantined_at", "reason"],
            sa.select(*(m[name] for name in QUARANTINED_COLUMNS), *extra).where(slot)))
        remove(conn, conversation_id, [seq])
    return Quarantined(conversation_id, seq, by, at, why)
