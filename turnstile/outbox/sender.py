"""The outbox's sender: moves the rows of an outbox table through the state
machine (turnstile.outbox.store; the sales app's `email_task`) and delivers
them over real SMTP.

`deliver_due` is one pass; `run_sender` is a blocking loop meant for a thread
of the worker process (`threading.Thread(target=run_sender, ...)` or
`asyncio.to_thread(run_sender, ...)`), stopped through a `threading.Event`.
It is synchronous on purpose: smtplib and the DB-API drivers block, and a
thread keeps them off the worker's event loop without a second async stack.

Delivery is at most once per task: a task is claimed (compare-and-set) before
any byte goes to SMTP, and a task whose outcome is unknown is parked as
"possibly sent" instead of being retried (outbox docstring). Failures before
the message data went out are retried after `retry_delays` (1 s, then 5 s);
the third failure, or a permanent 5xx answer, ends in DEAD. Every time it
stamps (claims, retry times, stale cut-offs, the Date header) and every wait
between passes comes from `SenderConfig.clock` (turnstile.outbox.clock; the
real clock unless a test hands its own).

A task that ends DEAD raises a flag, so nobody has to poll the table for it:
an error-level log line and the OpenTelemetry counter `turnstile.email.dead`
(attribute `reason`: `permanent` or `attempts exhausted`), on the meter
provider of `SenderConfig.meter_provider` or the process's global one (the
worker installs it: turnstile.runtime.tracing).
"""

from __future__ import annotations

import email.policy
import logging
import os
import smtplib
import socket
import threading
import uuid
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import format_datetime
from types import TracebackType
from typing import Any

from opentelemetry import metrics

from turnstile.engine.masking import mask_text
from turnstile.outbox.clock import SYSTEM_CLOCK, Clock
from turnstile.outbox.store import POSSIBLY_SENT, EmailStatus, EmailTask, OutboxStore
from turnstile.runtime.config import Settings
from turnstile.stores.db import Database

log = logging.getLogger(__name__)
DEAD_COUNTER = "turnstile.email.dead"


def _sender_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class SenderConfig:
    retry_delays: tuple[float, ...] = (1.0, 5.0)  # attempts = len(retry_delays) + 1
    # Longer than any send can take (several SMTP round trips, each bounded by
    # smtp_timeout_seconds): a task SENDING for longer lost its sender.
    stale_after_seconds: float = 300.0
    smtp_timeout_seconds: float = 20.0
    batch_size: int = 100  # tasks per pass
    # Tasks claimed per transaction. After a hard crash, up to this many
    # claimed-but-unsent tasks are parked as "possibly sent" (see outbox).
    claim_batch: int = 10
    from_addr: str = "turnstile@localhost"
    sender_id: str = field(default_factory=_sender_id)
    # Where `turnstile.email.dead` is counted (None: the global meter provider).
    meter_provider: metrics.MeterProvider | None = field(default=None, compare=False)
    # The worker's Prometheus endpoint (Temporal's runtime meter): `turnstile_mails_dead`.
    metric_meter: Any = field(default=None, compare=False)
    # What "now" is and how the loop waits (tests move a fake one by hand).
    clock: Clock = field(default=SYSTEM_CLOCK, compare=False)

    @property
    def max_attempts(self) -> int:
        return len(self.retry_delays) + 1


class DeliveryError(Exception):
    def __init__(self, message: str, *, permanent: bool = False, possibly_sent: bool = False):
        super().__init__(message)
        self.permanent = permanent
        self.possibly_sent = possibly_sent


def build_message(task: EmailTask, from_addr: str, clock: Clock = SYSTEM_CLOCK) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = from_addr
    msg["To"] = task.recipient
    msg["Subject"] = task.subject
    msg["Date"] = format_datetime(clock.now())
    # Fixed per task and recorded before the first attempt: a duplicate after
    # an uncertain outcome is recognisable as the same message.
    msg["Message-ID"] = task.message_id
    msg["X-Turnstile-Task-Id"] = task.task_id
    msg.set_content(task.body)
    return msg


class SmtpSession:
    """One SMTP connection for a pass, opened on first use, with the send
    split into phases so a failure says whether the data may have gone out."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._conn: smtplib.SMTP | None = None

    def __enter__(self) -> SmtpSession:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.quit()
        except OSError:  # smtplib.SMTPException is an OSError too
            conn.close()

    def send(self, msg: EmailMessage, sender: str, recipient: str) -> None:
        phase = "connect"
        try:
            if self._conn is None:
                self._conn = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
                self._conn.ehlo_or_helo_if_needed()
            conn = self._conn
            phase = "envelope"
            code, resp = conn.mail(sender)
            if code != 250:
                raise smtplib.SMTPSenderRefused(code, resp, sender)
            code, resp = conn.rcpt(recipient)
            if code not in (250, 251):
                raise smtplib.SMTPRecipientsRefused({recipient: (code, resp)})
            phase = "data"
            conn.data(msg.as_bytes(policy=email.policy.SMTP))  # non-250 raises SMTPDataError
        except smtplib.SMTPRecipientsRefused as exc:
            code = min(c for c, _ in exc.recipients.values())
            self._reset()
            raise DeliveryError(
                f"recipient refused: {exc.recipients}", permanent=code >= 500
            ) from exc
        except smtplib.SMTPResponseException as exc:
            # The server answered with a refusal: it did not take the message.
            self._reset()
            text = exc.smtp_error
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
            raise DeliveryError(
                f"SMTP server refused ({phase}): {exc.smtp_code} {text}",
                permanent=exc.smtp_code >= 500,
            ) from exc
        except OSError as exc:  # refused/reset/timeout/disconnected (SMTPException too)
            self.close()
            raise DeliveryError(
                f"cannot deliver to {self.host}:{self.port} ({phase}): {exc or type(exc).__name__}",
                possibly_sent=phase == "data",
            ) from exc

    def _reset(self) -> None:
        try:
            if self._conn is not None:
                self._conn.rset()
        except OSError:
            self.close()


def deliver_due(store: OutboxStore, db: Database, settings: Settings,
                config: SenderConfig | None = None, stop: threading.Event | None = None) -> int:
    """One pass: park stale claims, then claim (`claim_batch` tasks per
    transaction) and send what is due, over one SMTP connection. Returns the
    number of messages the SMTP server accepted in this pass. Claims not yet
    sent when `stop` is set or the pass fails are given back."""
    config = config or SenderConfig()
    clock = config.clock
    recovered = store.recover_stale(db, config.stale_after_seconds, now=clock.now())
    if recovered:
        log.warning("%d e-mail task(s) were stuck in SENDING: marked possibly sent", recovered)
    delivered = claimed = 0
    with SmtpSession(settings.smtp_host, settings.smtp_port, config.smtp_timeout_seconds) as smtp:
        while claimed < config.batch_size and not (stop and stop.is_set()):
            limit = min(config.claim_batch, config.batch_size - claimed)
            tasks = store.claim_due(db, config.sender_id, limit, now=clock.now())
            claimed += len(tasks)
            pending = list(tasks)
            try:
                while pending and not (stop and stop.is_set()):
                    if _deliver_one(store, db, smtp, pending[0], config):
                        delivered += 1
                    pending.pop(0)
            finally:
                for task in pending:  # never handed to SMTP
                    store.release(db, task, now=clock.now())
            if len(tasks) < limit:
                break  # nothing more is due
    return delivered


def _deliver_one(store: OutboxStore, db: Database, smtp: SmtpSession, task: EmailTask,
                 config: SenderConfig) -> bool:
    attempt = task.attempts  # the claim counted it
    try:
        try:
            msg = build_message(task, config.from_addr, config.clock)
        except ValueError as exc:  # a header the e-mail library refuses: never sendable
            raise DeliveryError(f"cannot build the message: {exc}", permanent=True) from exc
        smtp.send(msg, config.from_addr, task.recipient)
    except DeliveryError as exc:
        last = exc.permanent or attempt >= config.max_attempts
        retry_after = None if last else config.retry_delays[attempt - 1]
        error = str(exc)
        if exc.possibly_sent:
            error = f"{POSSIBLY_SENT}: {error}; not retried automatically"
        status = store.mark_failed(
            db, task.task_id, config.sender_id, attempt, error,
            retry_after=retry_after, possibly_sent=exc.possibly_sent, now=config.clock.now(),
        )
        if status is EmailStatus.DEAD:
            _raise_dead_flag(task, attempt, error, config,
                             "permanent" if exc.permanent else "attempts exhausted")
        else:
            log.warning("e-mail task %s attempt %d -> %s: %s", task.task_id, attempt, status,
                        mask_text(error))
        return False
    if not store.mark_sent(db, task.task_id, config.sender_id, attempt,
                            now=config.clock.now()):
        log.warning("e-mail task %s was sent but its claim had changed", task.task_id)
    log.info("e-mail task %s sent to %s (attempt %d)", task.task_id, mask_text(task.recipient),
             attempt)
    return True


def _raise_dead_flag(task: EmailTask, attempt: int, error: str, config: SenderConfig,
                     reason: str) -> None:
    log.error("e-mail task %s is DEAD after attempt %d (%s), never delivered to %s: %s",
              task.task_id, attempt, reason, mask_text(task.recipient), mask_text(error))
    provider = config.meter_provider or metrics.get_meter_provider()
    counter = provider.get_meter("turnstile.outbox.sender").create_counter(
        DEAD_COUNTER, unit="{task}",
        description="e-mail tasks that ended DEAD (dead letters): never delivered")
    counter.add(1, {"reason": reason})
    if config.metric_meter is not None:
        config.metric_meter.create_counter(
            "turnstile_mails_dead", "e-mail tasks that ended DEAD: never delivered").add(
            1, {"reason": reason[:64]})


def run_sender(
    store: OutboxStore,
    db: Database,
    settings: Settings,
    stop_event: threading.Event,
    poll_interval: float = 0.5,
    config: SenderConfig | None = None,
) -> None:
    """Deliver until `stop_event` is set. Blocking: run it in a thread."""
    config = config or SenderConfig()
    log.info(
        "e-mail sender %s delivering to %s:%s", config.sender_id, settings.smtp_host,
        settings.smtp_port,
    )
    while not stop_event.is_set():
        busy = False
        try:
            busy = deliver_due(store, db, settings, config, stop_event) >= config.batch_size
        except Exception:
            # The loop outlives any one failed pass (database restarting, lock
            # timeout...): the rows keep the state, the next pass resumes.
            log.exception("e-mail sender pass failed; retrying in %.1f s", poll_interval)
        if not busy:
            config.clock.sleep(poll_interval, stop_event)
    log.info("e-mail sender %s stopped", config.sender_id)
