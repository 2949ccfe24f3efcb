"""Partial model output while a turn runs (step 8), outside workflow history.

A streaming model activity appends coalesced text chunks to `turn_stream`
(`workflow_id, response_seq, attempt, chunk`); `python starter.py stream
WORKFLOW_ID` (or any SQL reader) follows them. History only ever holds the
final message, as without streaming.

Bounded: chunks are coalesced (>= FLUSH_CHARS or every FLUSH_SECONDS), at most
MAX_CHUNKS per model response attempt (then a final "…" chunk and nothing
more), and rows older than RETENTION_SECONDS are deleted whenever a new
stream opens. A retried attempt streams again under its own `attempt`.

This module is the one writer of `turn_stream`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import sqlalchemy as sa

from turnstile.stores.db import Database
from turnstile.stores.memory import now_iso
from turnstile.stores.tables import metadata

FLUSH_CHARS = 64
FLUSH_SECONDS = 0.2
MAX_CHUNKS = 1000
RETENTION_SECONDS = 24 * 3600.0


turn_stream = sa.Table(
    "turn_stream", metadata,
    sa.Column("workflow_id", sa.Text, primary_key=True),
    sa.Column("response_seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("chunk", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("done", sa.Integer, nullable=False, server_default="0"),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Index("turn_stream_created", "created_at"),
)
ts = turn_stream.c


class StreamChunk(NamedTuple):
    """One row of a turn's stream, as `read_stream` returns it."""

    response_seq: int
    attempt: int
    chunk: int
    text: str
    done: int  # 1 on the last chunk of a response attempt

    @property
    def position(self) -> tuple[int, int, int]:
        return (self.response_seq, self.attempt, self.chunk)


class StreamWriter:
    """Coalesces deltas of one model response attempt into rows."""

    def __init__(self, db: Database, workflow_id: str, response_seq: int, attempt: int) -> None:
        self.db, self.key = db, (workflow_id, response_seq, attempt)
        self.chunk = 0
        self.pending = ""
        self.last_flush = time.monotonic()
        self.truncated = False

    def _insert(self, text: str, done: bool) -> None:
        with self.db.connect() as conn:
            conn.insert_new(turn_stream, {
                "workflow_id": self.key[0], "response_seq": self.key[1], "attempt": self.key[2],
                "chunk": self.chunk, "text": text, "done": int(done), "created_at": now_iso()})
        self.chunk += 1

    async def open(self) -> None:
        # Same format as `now_iso()`, so the text comparison is a time comparison.
        cutoff = (datetime.now(UTC) - timedelta(seconds=RETENTION_SECONDS)).isoformat(
            timespec="milliseconds")
        await asyncio.to_thread(self._prune, cutoff)

    def _prune(self, cutoff: str) -> None:
        with self.db.connect() as conn:
            conn.execute(sa.delete(turn_stream).where(ts.created_at < cutoff))

    async def add(self, text: str) -> None:
        if self.truncated or not text:
            return
        self.pending += text
        due = time.monotonic() - self.last_flush >= FLUSH_SECONDS
        if len(self.pending) >= FLUSH_CHARS or due:
            await self._flush(done=False)

    async def _flush(self, done: bool) -> None:
        text, self.pending = self.pending, ""
        if self.chunk >= MAX_CHUNKS - 1 and not done:
            text, done, self.truncated = text + "…", True, True
        if text or done:
            await asyncio.to_thread(self._insert, text, done)
        self.last_flush = time.monotonic()

    async def close(self) -> None:
        if not self.truncated:
            await self._flush(done=True)


def read_stream(db: Database, workflow_id: str,
                after: tuple[int, int, int] = (-1, 0, -1)) -> list[StreamChunk]:
    """Rows after position `after` = (response_seq, attempt, chunk), in order."""
    s, a, c = after
    later = sa.or_(ts.response_seq > s, sa.and_(ts.response_seq == s, sa.or_(
        ts.attempt > a, sa.and_(ts.attempt == a, ts.chunk > c))))
    with db.connect() as conn:
        return conn.rows(sa.select(ts.response_seq, ts.attempt, ts.chunk, ts.text, ts.done)
                         .where(ts.workflow_id == workflow_id, later)
                         .order_by(ts.response_seq, ts.attempt, ts.chunk), StreamChunk)


async def follow_stream(db: Database, workflow_id: str, running: Callable[[], Awaitable[bool]],
                        write: Callable[[str], None], poll: float = 0.2) -> int:
    """Write the turn's partial text as it arrives until the turn has ended;
    returns the number of chunks read."""
    pos: tuple[int, int, int] = (-1, 0, -1)
    seen = 0
    while True:
        alive = await running()
        rows = await asyncio.to_thread(read_stream, db, workflow_id, pos)
        for r in rows:
            if pos[0] >= 0 and r.response_seq != pos[0]:
                write("\n")
            elif r.response_seq == pos[0] and r.attempt != pos[1]:
                write("\n[model request retried]\n")
            write(r.text)
            pos = r.position
            seen += 1
        if not alive and not rows:
            return seen
        await asyncio.sleep(poll)
