"""SIGKILL the e-mail sender process mid-batch, restart it: every task ends
SENT exactly once, or is reported as possibly sent (never silently twice)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller

from tests.support.processes import free_port
from tests.support.waiting import wait_until_sync
from tests.support.worker_process import WorkerProcess
from turnstile.sales import outbox
from turnstile.sales.outbox import EmailStatus
from turnstile.sales.smtp_server import MailboxHandler, read_mailbox
from turnstile.stores.db import Database
from turnstile.stores.schema import ensure_schema


class SlowMailbox(MailboxHandler):
    """A real SMTP server that takes its time, so a batch is still running
    when the sender is killed."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        await asyncio.sleep(0.15)
        return await super().handle_DATA(server, session, envelope)


def settled(db: Database, ids: list[str]) -> bool:
    tasks = [outbox.get(db, i) for i in ids]
    return all(t is not None and (t.status == EmailStatus.SENT or t.possibly_sent)
               for t in tasks)


def test_sender_killed_mid_batch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/mail.db"
    db = Database(url)
    ensure_schema(db)
    mailbox, port = tmp_path / "mail", free_port()
    tasks = [outbox.enqueue(db, idempotency_key=f"wf/call-{i}", recipient=f"ops{i}@example.com",
                            subject=f"Follow up {i}", body="body")[0] for i in range(30)]
    ids = [t.task_id for t in tasks]
    env = {"DATABASE_URL": url, "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(port),
           "TURNSTILE_SENDER_STALE_SECONDS": "1", "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    controller = Controller(SlowMailbox(mailbox), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        first = WorkerProcess(tmp_path / "sender1.log", env, ("--sender-only",),
                              ready_marker=b"e-mail sender running").start()
        # mid-batch: some sent, most not
        wait_until_sync(lambda: len(read_mailbox(mailbox)) >= 5, timeout=30,
                        what="the sender delivering 5 mails")
        first.kill()
        killed_at = Counter(t.status for t in (outbox.get(db, i) for i in ids) if t)
        assert killed_at[EmailStatus.SENT] < 30  # the kill really interrupted the batch
        second = WorkerProcess(tmp_path / "sender2.log", env, ("--sender-only",),
                               ready_marker=b"e-mail sender running").start()
        try:
            wait_until_sync(lambda: settled(db, ids), timeout=60, interval=0.1,
                            what="every task settled after the restart")
        finally:
            second.stop()
    finally:
        controller.stop()
    final = {i: outbox.get(db, i) for i in ids}
    received = Counter(str(m["Message-ID"]) for m in read_mailbox(mailbox))
    for task in final.values():
        assert task is not None
        copies = received[task.message_id]
        if task.status == EmailStatus.SENT:
            assert copies == 1, f"{task.task_id} SENT but received {copies} times"
        else:  # lost mid-send: parked for a person, delivered at most once
            assert task.possibly_sent and copies <= 1
    assert sum(received.values()) == len(received)  # no message-id arrived twice
