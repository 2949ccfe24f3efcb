"""The e-mail sender against a real SMTP server (aiosmtpd), on both databases."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from tests.support.waiting import wait_until_sync
from turnstile.runtime.config import Settings
from turnstile.sales import outbox
from turnstile.sales.outbox import EmailStatus, EmailTask
from turnstile.sales.sender import SenderConfig, deliver_due, run_sender
from turnstile.sales.smtp_server import LocalSmtpServer, MailboxHandler, read_mailbox
from turnstile.stores.db import Database

pytest_plugins = ["tests.support.databases"]

FAST = {"retry_delays": (0.05, 0.1), "smtp_timeout_seconds": 5.0}


class FakeClock:
    """A clock the test moves by hand: the sender's backoff and stale cut-off
    are read from it, so no test waits them out."""

    def __init__(self) -> None:
        self.moment = datetime.now(UTC)

    def now(self) -> datetime:
        return self.moment

    def advance(self, seconds: float) -> None:
        self.moment += timedelta(seconds=seconds)

    def sleep(self, seconds: float, until: threading.Event | None = None) -> bool:
        self.advance(seconds)
        return until is not None and until.is_set()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def port(unused_tcp_port: int) -> int:  # pytest-asyncio's free-port fixture
    return unused_tcp_port


@pytest.fixture
def settings(port: int) -> Settings:
    return Settings(smtp_host="127.0.0.1", smtp_port=port)


@pytest.fixture
def mailbox(tmp_path: Path) -> Path:
    return tmp_path / "mail"


@pytest.fixture
def smtp(mailbox: Path, port: int) -> Iterator[LocalSmtpServer]:
    with LocalSmtpServer(mailbox, port=port) as server:
        yield server


def queue(db: Database, n: int, prefix: str = "call") -> list[EmailTask]:
    return [
        outbox.enqueue(db, idempotency_key=f"wf/{prefix}-{i}", recipient=f"ops{i}@example.com",
                       subject=f"Follow up {i}", body=f"Body {i}\nsecond line")[0]
        for i in range(n)
    ]


def statuses(db: Database, tasks: list[EmailTask]) -> list[EmailStatus]:
    found = [outbox.get(db, t.task_id) for t in tasks]
    return [t.status for t in found if t is not None]


def received_ids(mailbox: Path) -> Counter[str]:
    return Counter(str(m["Message-ID"]) for m in read_mailbox(mailbox))


def test_delivers_queued_mail_and_marks_it_sent(db: Database, settings: Settings,
                                                smtp: LocalSmtpServer, mailbox: Path) -> None:
    tasks = queue(db, 3)
    assert deliver_due(db, settings, SenderConfig(**FAST)) == 3
    assert statuses(db, tasks) == [EmailStatus.SENT] * 3
    mails = read_mailbox(mailbox)
    assert {str(m["Message-ID"]) for m in mails} == {t.message_id for t in tasks}
    first = next(m for m in mails if m["X-Turnstile-Task-Id"] == tasks[0].task_id)
    assert (first["To"], first["Subject"]) == ("ops0@example.com", "Follow up 0")
    # stored as received: SMTP line endings
    assert first.get_content().replace("\r\n", "\n") == "Body 0\nsecond line\n"
    assert deliver_due(db, settings, SenderConfig(**FAST)) == 0  # nothing due: nothing resent
    task = outbox.get(db, tasks[0].task_id)
    assert task is not None and task.attempts == 1 and task.sent_at is not None


def test_smtp_outage_retries_then_delivers_each_mail_once(
        db: Database, settings: Settings, mailbox: Path, port: int, clock: FakeClock) -> None:
    config = SenderConfig(retry_delays=(1.0, 5.0), smtp_timeout_seconds=5.0, clock=clock)
    with LocalSmtpServer(mailbox, port=port):
        sent_before = queue(db, 2, "before")
        assert deliver_due(db, settings, config) == 2
    # outage: the server is gone while mail is queued
    tasks = queue(db, 5, "during")
    assert deliver_due(db, settings, config) == 0
    assert statuses(db, tasks) == [EmailStatus.FAILED] * 5
    failed = outbox.get(db, tasks[0].task_id)
    assert failed is not None and failed.attempts == 1 and "connect" in (failed.last_error or "")
    assert deliver_due(db, settings, config) == 0  # not due before its first delay (1 s)
    assert all(t and t.attempts == 1 for t in (outbox.get(db, t.task_id) for t in tasks))
    clock.advance(1.0)
    assert deliver_due(db, settings, config) == 0  # second attempt: still down
    assert all(t and t.attempts == 2 for t in (outbox.get(db, t.task_id) for t in tasks))
    with LocalSmtpServer(mailbox, port=port):  # back, same port
        clock.advance(4.9)
        assert deliver_due(db, settings, config) == 0  # not due yet (5 s)
        clock.advance(0.1)
        assert deliver_due(db, settings, config) == 5
    assert statuses(db, tasks) == [EmailStatus.SENT] * 5
    ids = received_ids(mailbox)
    assert set(ids) == {t.message_id for t in sent_before + tasks}  # none lost
    assert set(ids.values()) == {1}  # none duplicated


def test_a_task_that_keeps_failing_ends_dead(db: Database, settings: Settings,
                                             clock: FakeClock) -> None:
    (task,) = queue(db, 1)  # no SMTP server at all
    config = SenderConfig(clock=clock)  # the real delays: 1 s, then 5 s
    for wait, expected in ((0.0, EmailStatus.FAILED), (1.0, EmailStatus.FAILED),
                           (5.0, EmailStatus.DEAD)):
        clock.advance(wait)
        deliver_due(db, settings, config)
        assert statuses(db, [task]) == [expected]
    clock.advance(3600)
    deliver_due(db, settings, config)
    dead = outbox.get(db, task.task_id)
    assert dead is not None and dead.status == EmailStatus.DEAD and dead.attempts == 3


class _Refusing:
    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,  # noqa: N802
                          rcpt_options: list[str]) -> str:
        return "550 5.1.1 no such user"


class _SlowAnswer(MailboxHandler):
    """Stores the message, then answers too late: the client can't know."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        answer = await super().handle_DATA(server, session, envelope)
        await asyncio.sleep(1.0)
        return answer


def test_permanent_refusal_is_dead_at_once(db: Database, settings: Settings, port: int) -> None:
    controller = Controller(_Refusing(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        (task,) = queue(db, 1)
        deliver_due(db, settings, SenderConfig(**FAST))
    finally:
        controller.stop()
    dead = outbox.get(db, task.task_id)
    assert dead is not None and dead.status == EmailStatus.DEAD and dead.attempts == 1
    assert "550" in (dead.last_error or "")


def test_unknown_outcome_is_parked_not_resent(db: Database, settings: Settings, port: int,
                                              mailbox: Path, clock: FakeClock) -> None:
    controller = Controller(_SlowAnswer(mailbox), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        (task,) = queue(db, 1)
        config = SenderConfig(smtp_timeout_seconds=0.3, clock=clock)
        assert deliver_due(db, settings, config) == 0
        parked = outbox.get(db, task.task_id)
        assert parked is not None and parked.status == EmailStatus.FAILED and parked.possibly_sent
        assert (parked.last_error or "").startswith("possibly sent")
        clock.advance(3600)  # long past every retry delay
        assert deliver_due(db, settings, config) == 0  # never retried on its own
    finally:
        controller.stop()
    assert received_ids(mailbox) == Counter({task.message_id: 1})


def test_crashed_sender_leaves_possibly_sent_task(db: Database, settings: Settings,
                                                  smtp: LocalSmtpServer, mailbox: Path,
                                                  clock: FakeClock) -> None:
    (task,) = queue(db, 1)
    # claimed, then the process died
    assert outbox.claim(db, task, "crashed-sender", now=clock.now())
    config = SenderConfig(stale_after_seconds=300.0, clock=clock)
    clock.advance(299)
    assert deliver_due(db, settings, config) == 0  # too fresh: maybe still in flight
    assert statuses(db, [task]) == [EmailStatus.SENDING]
    clock.advance(2)
    assert deliver_due(db, settings, config) == 0
    parked = outbox.get(db, task.task_id)
    assert parked is not None and parked.status == EmailStatus.FAILED and parked.possibly_sent
    assert outbox.requeue(db, task.task_id) == (False, parked)  # not without a person's check
    requeued, _ = outbox.requeue(db, task.task_id, allow_possibly_sent=True)
    assert requeued and deliver_due(db, settings, config) == 1
    assert received_ids(mailbox) == Counter({task.message_id: 1})


def test_concurrent_senders_never_send_twice(db: Database, settings: Settings,
                                             smtp: LocalSmtpServer, mailbox: Path) -> None:
    tasks = queue(db, 40)
    start = threading.Barrier(4)
    delivered: list[int] = []

    def sender() -> None:
        config = SenderConfig(batch_size=40, **FAST)  # each sees every task as due
        start.wait()
        delivered.append(deliver_due(db, settings, config))

    threads = [threading.Thread(target=sender) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(delivered) == 40
    assert statuses(db, tasks) == [EmailStatus.SENT] * 40
    ids = received_ids(mailbox)
    assert len(ids) == 40 and set(ids.values()) == {1}


def test_run_sender_loop_delivers_and_stops(db: Database, settings: Settings,
                                            smtp: LocalSmtpServer, mailbox: Path) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=run_sender,
                              args=(db, settings, stop, 0.05, SenderConfig(**FAST)))
    thread.start()
    try:
        tasks = queue(db, 2)
        wait_until_sync(lambda: statuses(db, tasks) == [EmailStatus.SENT] * 2,
                        what="both tasks SENT")
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()
    assert len(received_ids(mailbox)) == 2
