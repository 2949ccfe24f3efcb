"""The outbox's state machine: the rows of an outbox table (turnstile.outbox.table;
the sales app's `email_task`) and every allowed state change.

    QUEUED --claim--> SENDING --accepted--> SENT
                         |--refused/unreachable--> FAILED --(after 1 s, 5 s)--> SENDING ...
                         |--3rd failure or permanent 5xx--> DEAD
                         '--outcome unknown--> FAILED + possibly_sent
    QUEUED/FAILED --cancel--> CANCELLED          FAILED --requeue--> QUEUED

Every change is a compare-and-set UPDATE (`WHERE status = <what we saw>`), so
two senders, or a sender and a compensation, never both win. A claim bumps
`attempts` and records the sender id; (`claimed_by`, `attempts`) is the
claim token that later marks the outcome. The sender claims a small batch in
one transaction (`claim_due`) and marks each outcome in its own; claims it
did not get to send are given back (`release`) when it stops. A sender killed
outright leaves its unsent claims SENDING, and stale recovery parks them as
"possibly sent" like the one in flight: never sent twice, at the price of a
person checking up to one claim batch after a crash.

"Possibly sent": a task found in SENDING longer than a sender could take
(sender crashed), or one whose connection broke after the message data went
out, may or may not have reached the SMTP server: SMTP has no way to ask. It
becomes FAILED with `possibly_sent` set and a `last_error` saying so, and the
sender never retries it on its own: an automatic retry could send a second
copy. `retryEmailTask` refuses it too (the model cannot look into a mailbox);
a person who checked the recipient's mailbox for the task's Message-ID (fixed
per task, recorded at creation) re-queues it with `requeue(...,
allow_possibly_sent=True)`. Every attempt reuses that Message-ID, so a
duplicate that does happen is recognisable as one.

Roles (PostgreSQL, turnstile.runtime.tool_access): `enqueue` inserts as the
store's `insert_role` (the sales app's e-mail tool role, which may do nothing
else); every other read and state change runs as its `sender_role`; None is
the application's own role. Each statement runs under a statement timeout.
The `*_in` forms run on the caller's connection — the tools' and
compensation's: the call journal's, so the change commits with the call's
record — and switch to the role each statement needs themselves.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from turnstile.engine.errors import TurnstileError
from turnstile.engine.specs import DEFAULT_STATEMENT_TIMEOUT_SECONDS as TIMEOUT
from turnstile.runtime.tool_access import as_role, tool_connection
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.timestamps import now_text, utc_text


class DeliveryInProgress(TurnstileError):
    """A cancel met its message claimed by a sender's new delivery attempt
    (it settled once, then was claimed again): retryable, the compensation
    runs again once the attempt has ended."""


class EmailStatus(StrEnum):
    QUEUED = "QUEUED"
    SENDING = "SENDING"
    SENT = "SENT"
    FAILED = "FAILED"
    DEAD = "DEAD"
    CANCELLED = "CANCELLED"


POSSIBLY_SENT = "possibly sent"  # prefix of last_error for the uncertain case


@dataclass(frozen=True)
class EmailTask:
    task_id: str
    idempotency_key: str
    recipient: str
    subject: str
    body: str
    status: EmailStatus
    attempts: int
    last_error: str | None
    created_at: str
    updated_at: str
    message_id: str
    next_attempt_at: str | None
    claimed_by: str | None
    claimed_at: str | None
    sent_at: str | None
    possibly_sent: bool

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> EmailTask:
        """The task of an outbox row (every column, as `select(table)`)."""
        fields = dict(row._mapping)
        fields["status"] = EmailStatus(fields["status"])
        fields["possibly_sent"] = bool(fields["possibly_sent"])  # 0/1 on SQLite
        return cls(**fields)


def message_id_for(task_id: str) -> str:
    return f"<{task_id}@turnstile.local>"


def _stamp(now: datetime | None) -> str:
    """`now` (the sender's clock), or the real time, in the stored form."""
    return now_text() if now is None else utc_text(now)


def _after(seconds: float, now: datetime | None) -> str:
    return utc_text((now or datetime.now(UTC)) + timedelta(seconds=seconds))


class OutboxStore:
    """The state changes of one outbox table, as its roles."""

    def __init__(self, table: sa.Table, *, insert_role: str | None = None,
                 sender_role: str | None = None) -> None:
        self.table = table
        self.insert_role = insert_role
        self.sender_role = sender_role

    def _is_due(self, now: str) -> sa.ColumnElement[bool]:
        """QUEUED, or FAILED (not possibly sent) whose retry time came."""
        t = self.table
        return sa.or_(
            t.c.status == EmailStatus.QUEUED.value,
            sa.and_(t.c.status == EmailStatus.FAILED.value, t.c.possibly_sent == sa.false(),
                    t.c.next_attempt_at <= now),
        )

    def _get(self, conn: Connection, task_id: str) -> EmailTask | None:
        t = self.table
        row = conn.execute(sa.select(t).where(t.c.task_id == task_id)).first()
        return EmailTask.from_row(row) if row else None

    def get(self, db: Database, task_id: str, *,
            timeout_seconds: float = TIMEOUT) -> EmailTask | None:
        with tool_connection(db, self.sender_role, timeout_seconds=timeout_seconds) as conn:
            return self._get(conn, task_id)

    def get_in(self, conn: Connection, task_id: str) -> EmailTask | None:
        """`get` on the caller's connection (as the sender's role)."""
        with as_role(conn, self.sender_role):
            return self._get(conn, task_id)

    def enqueue(
        self, db: Database, *, idempotency_key: str, recipient: str, subject: str, body: str,
        timeout_seconds: float = TIMEOUT,
    ) -> tuple[EmailTask, bool]:
        """Queue one message; the same key returns the existing task. -> (task, created)."""
        with tool_connection(db, None, timeout_seconds=timeout_seconds) as conn:
            return self.enqueue_in(conn, idempotency_key=idempotency_key, recipient=recipient,
                                   subject=subject, body=body)

    def enqueue_in(self, conn: Connection, *, idempotency_key: str, recipient: str,
                   subject: str, body: str) -> tuple[EmailTask, bool]:
        """`enqueue` on the caller's connection (a tool's: the call journal's).
        The INSERT runs as the insert role (which may only insert); the read
        back as the sender's (PostgreSQL; turnstile.runtime.tool_access)."""
        task_id = f"mail-{uuid.uuid4().hex}"
        now = now_text()
        insert = sa.insert(self.table).values(
            task_id=task_id, idempotency_key=idempotency_key, recipient=recipient,
            subject=subject, body=body, status=EmailStatus.QUEUED.value, attempts=0,
            created_at=now, updated_at=now, message_id=message_id_for(task_id))
        created = True
        refused: sa.exc.IntegrityError | None = None
        with as_role(conn, self.insert_role):
            # A plain INSERT in a savepoint, not ON CONFLICT: that would need
            # SELECT on the key, and this role may not read.
            try:
                with conn.sa.begin_nested():
                    conn.execute(insert)
            except sa.exc.IntegrityError as err:
                created, refused = False, err
        task = self.by_key_in(conn, idempotency_key)
        if task is None:  # refused, and not because this key is already queued
            assert refused is not None
            raise refused
        return task, created

    def by_key_in(self, conn: Connection, idempotency_key: str) -> EmailTask | None:
        """The task a call queued, on the caller's connection (as the sender's role)."""
        with as_role(conn, self.sender_role):
            return self._by_key(conn, idempotency_key)

    def _by_key(self, conn: Connection, idempotency_key: str) -> EmailTask | None:
        t = self.table
        row = conn.execute(sa.select(t).where(t.c.idempotency_key == idempotency_key)).first()
        return EmailTask.from_row(row) if row else None

    def find_by_key(self, db: Database, idempotency_key: str, *,
                    timeout_seconds: float = TIMEOUT) -> EmailTask | None:
        with tool_connection(db, self.sender_role, timeout_seconds=timeout_seconds) as conn:
            return self._by_key(conn, idempotency_key)

    def cancel(self, db: Database, task_id: str, *,
               timeout_seconds: float = TIMEOUT) -> tuple[bool, EmailTask | None]:
        """QUEUED/FAILED -> CANCELLED. -> (cancelled now, task as it is afterwards)."""
        with tool_connection(db, None, timeout_seconds=timeout_seconds) as conn:
            return self.cancel_in(conn, task_id)

    def cancel_in(self, conn: Connection, task_id: str) -> tuple[bool, EmailTask | None]:
        """`cancel` on the caller's connection (the cancel compensation: the
        call journal's), as the sender's role."""
        t = self.table
        with as_role(conn, self.sender_role):
            cur = conn.execute(
                sa.update(t)
                .where(t.c.task_id == task_id,
                       t.c.status.in_([EmailStatus.QUEUED.value, EmailStatus.FAILED.value]))
                .values(status=EmailStatus.CANCELLED.value, next_attempt_at=None,
                        updated_at=now_text()))
            return cur.rowcount == 1, self._get(conn, task_id)

    def requeue(
        self, db: Database, task_id: str, *, allow_possibly_sent: bool = False,
        timeout_seconds: float = TIMEOUT,
    ) -> tuple[bool, EmailTask | None]:
        """FAILED -> QUEUED, due now. A possibly-sent task only with the explicit flag."""
        with tool_connection(db, None, timeout_seconds=timeout_seconds) as conn:
            return self.requeue_in(conn, task_id, allow_possibly_sent=allow_possibly_sent)

    def requeue_in(self, conn: Connection, task_id: str, *,
                   allow_possibly_sent: bool = False) -> tuple[bool, EmailTask | None]:
        """`requeue` on the caller's connection (a retry tool's: the call
        journal's), as the sender's role."""
        t = self.table
        with as_role(conn, self.sender_role):
            stmt = sa.update(t).where(t.c.task_id == task_id,
                                      t.c.status == EmailStatus.FAILED.value)
            if not allow_possibly_sent:
                stmt = stmt.where(t.c.possibly_sent == sa.false())
            cur = conn.execute(stmt.values(status=EmailStatus.QUEUED.value,
                                           next_attempt_at=None, possibly_sent=False,
                                           updated_at=now_text()))
            return cur.rowcount == 1, self._get(conn, task_id)

    def due(self, db: Database, limit: int, *, now: datetime | None = None) -> list[EmailTask]:
        """Tasks a sender may claim now: QUEUED, or FAILED whose retry time came."""
        t = self.table
        with tool_connection(db, self.sender_role) as conn:
            rows = conn.execute(sa.select(t).where(self._is_due(_stamp(now)))
                                .order_by(t.c.created_at, t.c.task_id).limit(limit)).all()
        return [EmailTask.from_row(r) for r in rows]

    def claim(self, db: Database, task: EmailTask, sender_id: str, *,
              now: datetime | None = None) -> bool:
        """Compare-and-set QUEUED/FAILED -> SENDING; False if another sender won."""
        t = self.table
        stamp = _stamp(now)
        with tool_connection(db, self.sender_role) as conn:
            cur = conn.execute(
                sa.update(t)
                .where(t.c.task_id == task.task_id, t.c.status == task.status.value,
                       t.c.attempts == task.attempts)
                .values(status=EmailStatus.SENDING.value, attempts=t.c.attempts + 1,
                        claimed_by=sender_id, claimed_at=stamp, next_attempt_at=None,
                        updated_at=stamp))
            return cur.rowcount == 1

    def claim_due(self, db: Database, sender_id: str, limit: int, *,
                  now: datetime | None = None) -> list[EmailTask]:
        """Claim up to `limit` due tasks in one transaction (QUEUED/FAILED ->
        SENDING, attempts + 1, claimed by `sender_id`), oldest first. On
        PostgreSQL rows another sender is claiming are skipped (SKIP LOCKED);
        the due condition is checked again on every row the UPDATE changes, so
        no task is claimed twice."""
        t = self.table
        stamp = _stamp(now)
        is_due = self._is_due(stamp)
        pick = (sa.select(t.c.task_id).where(is_due).order_by(t.c.created_at, t.c.task_id)
                .limit(limit).with_for_update(skip_locked=True))
        stmt = (
            sa.update(t).where(t.c.task_id.in_(pick), is_due)
            .values(status=EmailStatus.SENDING.value, attempts=t.c.attempts + 1,
                    claimed_by=sender_id, claimed_at=stamp, next_attempt_at=None,
                    updated_at=stamp)
            .returning(*t.c)
        )
        with tool_connection(db, self.sender_role) as conn:
            rows = conn.execute(stmt).all()
        tasks = [EmailTask.from_row(r) for r in rows]
        return sorted(tasks, key=lambda task: (task.created_at, task.task_id))

    def release(self, db: Database, task: EmailTask, *, now: datetime | None = None) -> bool:
        """Give back a claim whose message was never handed to SMTP (the sender
        is stopping): SENDING -> QUEUED, the attempt not counted."""
        t = self.table
        with tool_connection(db, self.sender_role) as conn:
            cur = conn.execute(
                sa.update(t)
                .where(t.c.task_id == task.task_id, t.c.status == EmailStatus.SENDING.value,
                       t.c.claimed_by == task.claimed_by, t.c.attempts == task.attempts)
                .values(status=EmailStatus.QUEUED.value, attempts=t.c.attempts - 1,
                        claimed_by=None, claimed_at=None, updated_at=_stamp(now)))
            return cur.rowcount == 1

    def mark_sent(self, db: Database, task_id: str, sender_id: str, attempt: int, *,
                  now: datetime | None = None) -> bool:
        # Only the claim token: if stale recovery or a cancel changed the status
        # while we were sending, the truth is still that the server accepted it.
        t = self.table
        stamp = _stamp(now)
        with tool_connection(db, self.sender_role) as conn:
            cur = conn.execute(
                sa.update(t)
                .where(t.c.task_id == task_id, t.c.claimed_by == sender_id,
                       t.c.attempts == attempt)
                .values(status=EmailStatus.SENT.value, sent_at=stamp, updated_at=stamp,
                        last_error=None, possibly_sent=False))
            return cur.rowcount == 1

    def mark_failed(
        self,
        db: Database,
        task_id: str,
        sender_id: str,
        attempt: int,
        error: str,
        *,
        retry_after: float | None,
        possibly_sent: bool = False,
        now: datetime | None = None,
    ) -> EmailStatus | None:
        """SENDING -> FAILED, due again after `retry_after` s; DEAD when
        `retry_after` is None; FAILED and parked when `possibly_sent`. Returns
        the new status, or None if the claim was lost. It also overrides a
        stale-recovery "possibly sent" guess on our own claim: this sender
        knows how far it got."""
        t = self.table
        if possibly_sent:
            status, next_at = EmailStatus.FAILED, None
        elif retry_after is None:
            status, next_at = EmailStatus.DEAD, None
        else:
            status, next_at = EmailStatus.FAILED, _after(retry_after, now)
        with tool_connection(db, self.sender_role) as conn:
            cur = conn.execute(
                sa.update(t)
                .where(t.c.task_id == task_id, t.c.claimed_by == sender_id,
                       t.c.attempts == attempt,
                       t.c.status.in_([EmailStatus.SENDING.value, EmailStatus.FAILED.value]))
                .values(status=status.value, last_error=error[:2000], next_attempt_at=next_at,
                        possibly_sent=possibly_sent, updated_at=_stamp(now)))
            return status if cur.rowcount == 1 else None

    def recover_stale(self, db: Database, older_than_seconds: float, *,
                      now: datetime | None = None) -> int:
        """SENDING for too long (its sender died) -> FAILED + possibly_sent."""
        t = self.table
        cutoff = _after(-older_than_seconds, now)
        with tool_connection(db, self.sender_role) as conn:
            cur = conn.execute(
                sa.update(t)
                .where(t.c.status == EmailStatus.SENDING.value, t.c.claimed_at < cutoff)
                .values(status=EmailStatus.FAILED.value, possibly_sent=True,
                        next_attempt_at=None,
                        last_error=f"{POSSIBLY_SENT}: the sender stopped while delivering; the "
                        "SMTP server may have accepted it. Not retried automatically: check "
                        "the recipient's mailbox for the Message-ID first",
                        updated_at=_stamp(now)))
            return cur.rowcount
