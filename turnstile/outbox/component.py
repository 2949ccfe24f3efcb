"""`Outbox`: durable outbound e-mail an app adds to its tools (docs/outbox.md).

    mail = Outbox("library_mail")          # the app's own table (or a shared one)

    @tool(requires_approval=True, transactional=True, idempotent=True)
    def notifyMember(ctx: ToolContext, to: str, subject: str, body: str) -> dict:
        task, _ = mail.enqueue(ctx, to=to, subject=subject, body=body)
        return {"taskId": task.task_id, "status": task.status}

    @notifyMember.compensation
    def unnotify(ctx: ToolContext, arguments: Any, result: Any) -> Undo | str:
        return mail.cancel(ctx, result["taskId"])

    app = App(name="library", services=[...], tables=[*mine, *mail.tables],
              background=mail.background, dev_services=mail.dev_services)

`enqueue` inside a tool writes on the call journal's connection: the queued
row commits with the call's record, or not at all, and a call run again finds
its row by the call's idempotency key instead of queueing a second one. The
sender (`background`: a thread of the worker) claims each row before any byte
goes to SMTP, so a message reaches the server once; retries, dead letters
and "possibly sent" are the state machine's (turnstile.outbox.store). `cancel`
is the compensation: a message not yet handed to SMTP is never sent.
`dev_services`: the local SMTP server `make up` / `turnstile up` start when
SMTP_HOST is this machine (turnstile.outbox.smtp_server, mail under
`.data/mail`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import sqlalchemy as sa

from turnstile.outbox.sender import SenderConfig, run_sender
from turnstile.outbox.store import DeliveryInProgress, EmailStatus, EmailTask, OutboxStore
from turnstile.outbox.table import outbox_table
from turnstile.runtime.apps import Background, BackgroundContext, DevService
from turnstile.runtime.config import Settings
from turnstile.runtime.tool_access import tool_connection, tool_transaction
from turnstile.runtime.tools import ToolContext, Undo
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database

LOCAL_HOSTS = ("localhost", "127.0.0.1")
SENDER_NAME = "e-mail sender"  # the worker logs "e-mail sender running (app NAME)"

Where = ToolContext | Connection | Database
# How often a compensation looks whether a delivery attempt has ended.
SETTLE_POLL_SECONDS = 0.05


class Outbox:
    """A durable outbox on one table. `table`: its name (each app its own,
    or one several apps share: the same name is the same table). PostgreSQL
    roles (None: the application's): `insert_role` queues and may do nothing
    else, `sender_role` reads and changes state (the sales app's
    `turnstile_email` and `turnstile_sender`). `metadata`: the app's own
    MetaData to declare the table on (None: the outbox's shared one)."""

    def __init__(self, table: str = "outbox_mail", *, metadata: sa.MetaData | None = None,
                 insert_role: str | None = None, sender_role: str | None = None,
                 sender: SenderConfig | None = None, poll_seconds: float = 0.5,
                 settle_seconds: float | None = None) -> None:
        self.table = outbox_table(table, metadata=metadata, insert_role=insert_role,
                                  sender_role=sender_role)
        self.store = OutboxStore(self.table, insert_role=insert_role, sender_role=sender_role)
        self.sender = sender
        self.poll_seconds = poll_seconds
        # How long a compensation waits for a delivery attempt to end (None:
        # one SMTP timeout and a margin; well inside the compensation's own).
        self.settle_seconds = (settle_seconds if settle_seconds is not None
                               else (sender or SenderConfig()).smtp_timeout_seconds + 5.0)

    def __repr__(self) -> str:
        return f"Outbox({self.table.name!r})"

    @property
    def tables(self) -> tuple[sa.Table, ...]:
        """What the app adds to `App.tables` (made when missing, on start)."""
        return (self.table,)

    @property
    def max_attempts(self) -> int:
        return (self.sender or SenderConfig()).max_attempts

    # --- what tools call ---------------------------------------------------

    @contextmanager
    def _conn(self, where: Where) -> Iterator[Connection]:
        if isinstance(where, ToolContext):
            with tool_transaction(where, None) as conn:
                yield conn
        elif isinstance(where, Database):
            with tool_connection(where, None) as conn:
                yield conn
        else:
            yield where

    def enqueue(self, where: Where, *, to: str, subject: str, body: str,
                key: str | None = None) -> tuple[EmailTask, bool]:
        """Queue one message -> (task, created now). In a tool, `where` is its
        ToolContext: the row commits with the call's record, keyed by the
        call's idempotency key (a retried call finds its row: created False).
        Elsewhere a Connection (inside the caller's transaction) or the
        Database, with `key` (the same key never queues twice)."""
        if key is None:
            if not isinstance(where, ToolContext):
                raise ValueError("Outbox.enqueue outside a tool needs key=")
            key = where.idempotency_key
        with self._conn(where) as conn:
            return self.store.enqueue_in(conn, idempotency_key=key, recipient=to,
                                         subject=subject, body=body)

    def status(self, where: Where, task_id: str) -> EmailTask | None:
        """The task as it is now (None: no such task)."""
        with self._conn(where) as conn:
            return self.store.get_in(conn, task_id)

    def find(self, where: Where, key: str) -> EmailTask | None:
        """The task queued under `key` (a call's idempotency key)."""
        with self._conn(where) as conn:
            return self.store.by_key_in(conn, key)

    def requeue(self, where: Where, task_id: str, *,
                allow_possibly_sent: bool = False) -> tuple[bool, EmailTask | None]:
        """FAILED -> QUEUED (not a possibly-sent one unless a person checked)."""
        with self._conn(where) as conn:
            return self.store.requeue_in(conn, task_id,
                                         allow_possibly_sent=allow_possibly_sent)

    def cancel(self, where: Where, task_id: str | None = None) -> Undo | str:
        """The compensation: cancel the task if it was not handed to SMTP yet,
        and say what happened (an `Undo` with `undone=False` when the message
        went, or may have gone, out). In a compensation, `where` is its
        ToolContext and `task_id` the recorded result's (None: the task the
        call's idempotency key queued, if any)."""
        if not task_id and not isinstance(where, ToolContext):
            raise ValueError("Outbox.cancel outside a compensation needs the task id")
        settled = False  # outside a turn's compensation nothing waits
        if isinstance(where, ToolContext) and where.journal_tx is not None:
            settled = self._settle(where, task_id)
        with self._conn(where) as conn:
            task = self._task(conn, where, task_id)
            if task is None:
                return "no e-mail task was created by this call; nothing to undo"
            cancelled, now = self.store.cancel_in(conn, task.task_id)
        if settled and now is not None and now.status is EmailStatus.SENDING:
            # A sender claimed it again between the wait and the cancel: this
            # attempt rolls back and Temporal runs the compensation again.
            raise DeliveryInProgress(
                f"e-mail task {task.task_id} was claimed for delivery while being cancelled")
        return cancel_outcome(now or task, cancelled)

    def _task(self, conn: Connection, where: Where, task_id: str | None) -> EmailTask | None:
        if task_id:
            return self.store.get_in(conn, task_id)
        assert isinstance(where, ToolContext)  # cancel() refused the rest
        return self.store.by_key_in(conn, where.idempotency_key)

    def _settle(self, ctx: ToolContext, task_id: str | None) -> bool:
        """Wait, outside the call journal's transaction, while a sender's
        delivery attempt has the task SENDING: the attempt then ends SENT
        (the effect remains) or FAILED (the cancel wins), instead of the
        compensation reporting "being delivered" for a message that an
        outage keeps from going out. On SQLite the journal's transaction
        would hold the write lock the sender needs to say how the attempt
        ended, so nothing of it is open yet. False: still SENDING after
        `settle_seconds` (a sender lost mid-attempt; stale recovery parks it)."""
        deadline = time.monotonic() + self.settle_seconds
        while True:
            with tool_connection(ctx.db, None) as conn:
                task = self._task(conn, ctx, task_id)
            if task is None or task.status is not EmailStatus.SENDING:
                return True
            if time.monotonic() >= deadline:
                return False
            # No heartbeat of its own: the compensation's activity beats
            # while its undo runs (a sync undo runs in a thread).
            time.sleep(SETTLE_POLL_SECONDS)

    # --- what the app hands the runtime ---------------------------------------

    def run_sender(self, ctx: BackgroundContext) -> None:
        """The sender: delivers this outbox's due messages until the worker stops."""
        base = self.sender or SenderConfig()
        config = SenderConfig(
            retry_delays=base.retry_delays, stale_after_seconds=ctx.settings.sender_stale_seconds,
            smtp_timeout_seconds=base.smtp_timeout_seconds, batch_size=base.batch_size,
            claim_batch=base.claim_batch, from_addr=base.from_addr,
            meter_provider=base.meter_provider, metric_meter=ctx.metric_meter, clock=base.clock)
        run_sender(self.store, ctx.db, ctx.settings, ctx.stop, self.poll_seconds, config)

    @property
    def background(self) -> Mapping[str, Background]:
        """`App.background`: the sender, one thread of the worker."""
        return {SENDER_NAME: self.run_sender}

    def dev_services(self, settings: Settings) -> Sequence[DevService]:
        """`App.dev_services`: the local SMTP server (`python -m
        turnstile.outbox.smtp_server`, each mail a file under .data/mail) when
        SMTP_HOST is this machine; nothing when it is another."""
        return smtp_dev_services(settings)


def smtp_dev_services(settings: Settings) -> Sequence[DevService]:
    if settings.smtp_host not in LOCAL_HOSTS:
        return ()
    command = [sys.executable, "-m", "turnstile.outbox.smtp_server",
               "--port", str(settings.smtp_port), "--dir", str(settings.data_dir / "mail")]
    return (DevService("smtp", command, settings.smtp_host, settings.smtp_port),)


def cancel_outcome(task: EmailTask, cancelled: bool) -> Undo | str:
    """What a cancel did, as the compensation reports it."""
    if cancelled and task.possibly_sent:
        return Undo(
            f"e-mail task {task.task_id} cancelled, but an earlier delivery attempt was "
            "interrupted: it may already have reached the recipient (effect may remain)",
            undone=False,
        )
    if cancelled:
        return f"e-mail task {task.task_id} cancelled before it was sent; nothing was delivered"
    match task.status:
        case EmailStatus.SENT:
            return Undo(
                f"e-mail task {task.task_id} was already sent to {task.recipient} at "
                f"{task.sent_at}; an e-mail cannot be recalled: the effect remains",
                undone=False,
            )
        case EmailStatus.SENDING:
            return Undo(
                f"e-mail task {task.task_id} is being delivered right now and cannot be "
                "stopped; it will most likely arrive: the effect remains",
                undone=False,
            )
        case EmailStatus.DEAD:
            return f"e-mail task {task.task_id} was never delivered (DEAD); nothing to undo"
    return f"e-mail task {task.task_id} was already {task.status.value}; nothing to undo"
