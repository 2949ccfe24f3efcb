"""The public outbox (`turnstile.Outbox`) in an app of the tests' own
(tests/support/outbox_app.py, not the sales app): real turns (a Temporal dev
server, the worker serving just that app, SQLite), real SMTP.

- one mail reaches the SMTP server per approved call;
- a turn that fails after the mail was queued rolls back: the compensation
  cancels the mail before it is sent, and nothing is ever delivered for it;
- through an SMTP outage (attempts held SENDING by a server that never
  greets): the approved mail arrives once the server is back, once; a
  rolled-back turn's compensation waits for the attempt to end and cancels
  its mail, which never goes;
- the sender process SIGKILLed mid-batch and restarted: every message SENT
  exactly once, or parked "possibly sent" (never silently twice);
- what `make up` / `turnstile up` start for an app that uses the outbox: the
  local SMTP server, as a real process.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from pathlib import Path

import sqlalchemy as sa
from aiosmtpd.controller import Controller
from temporalio.client import Client

from tests.support.outbox_app import TABLE, build_app
from tests.support.processes import free_port
from tests.support.waiting import wait_until, wait_until_sync
from tests.support.worker_process import WorkerProcess
from tests.test_sender_crash import SlowMailbox
from turnstile import Outbox, Settings
from turnstile.outbox import EmailStatus, EmailTask, SenderConfig
from turnstile.outbox.sender import deliver_due
from turnstile.outbox.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.runtime.apps import dev_services_of
from turnstile.runtime.devstack import Stack, answers
from turnstile.sales.check import check
from turnstile.stores.db import Database
from turnstile.stores.ledger import tool_call_ledger
from turnstile.stores.schema import upgrade
from turnstile.testing import TestStack


def tasks(db: Database) -> list[EmailTask]:
    table = Outbox(TABLE).table
    with db.connect() as conn:
        rows = conn.execute(sa.select(table).order_by(table.c.created_at)).all()
    return [EmailTask.from_row(r) for r in rows]


def task_to(db: Database, recipient: str) -> EmailTask:
    [found] = [t for t in tasks(db) if t.recipient == recipient]
    return found


async def test_one_mail_per_approved_call(tmp_path: Path) -> None:
    async with TestStack(build_app(), tmp_path) as stack:
        result = await stack.run("notify ann@example.com and bo@example.com", approve="bob")
        assert result.status == "completed", result.error
        assert [c.name for c in result.tool_calls] == ["sendNotice", "sendNotice"]
        await wait_until(lambda: len(stack.mail) >= 2, timeout=20, what="two mails delivered")
        queued = {t.task_id: t for t in tasks(stack.db)}
        await wait_until(lambda: all(t.status is EmailStatus.SENT for t in tasks(stack.db)),
                         timeout=10, what="both tasks SENT")
        await asyncio.sleep(1.5)  # several more sender passes: nothing goes twice
        assert sorted(str(m["To"]) for m in stack.mail) == ["ann@example.com", "bo@example.com"]
        assert Counter(str(m["Message-ID"]) for m in stack.mail) == Counter(
            t.message_id for t in queued.values())
        assert len(queued) == 2


async def test_a_rolled_back_turn_cancels_its_mail_before_sending(tmp_path: Path) -> None:
    # The sender waits between passes longer than the turn takes: the
    # compensation meets the mail QUEUED; a pass afterwards sends nothing.
    mail = Outbox(TABLE, poll_seconds=120.0)
    async with TestStack(build_app(mail), tmp_path) as stack:
        result = await stack.run("notify cy@example.com about ticket broken", approve="bob")
        assert result.status == "rolled_back", result
        send, close = result.tool_calls
        assert (send.name, send.rolled_back, close.name, close.is_error) == (
            "sendNotice", True, "closeTicket", True)
        task = task_to(stack.db, "cy@example.com")
        assert task.status is EmailStatus.CANCELLED and task.attempts == 0
        settings = Settings(smtp_host="127.0.0.1", smtp_port=stack.mailbox.port)
        assert deliver_due(mail.store, stack.db, settings) == 0
        assert stack.mail == []
        assert mail.status(stack.db, task.task_id) == task  # untouched by the pass
        # `starter.py check` covers the app's outbox: it agrees now ...
        async def temporal() -> Client:
            return await Client.connect(stack.temporal_address)

        report = await check(stack.db, temporal, tables=mail.tables)
        assert report.disagreements == [] and report.exit_code == 0, report.lines()
        # ... and names a rolled-back call whose mail is not cancelled,
        with stack.db.connect() as conn:
            conn.execute(sa.update(mail.table).values(status=EmailStatus.SENT.value))
        report = await check(stack.db, temporal, tables=mail.tables)
        assert [line.split(": ", 1)[1] for line in report.disagreements] == [
            f"call {send.id} (sendNotice) of turn {result.workflow_id}: rolled back in "
            f"memory; its mail in {TABLE} is SENT"]
        # ... and a mail whose call has no completed record.
        with stack.db.connect() as conn:
            conn.execute(sa.update(tool_call_ledger).where(
                tool_call_ledger.c.tool_call_id == send.id).values(status="STARTED"))
        report = await check(stack.db, temporal, tables=mail.tables)
        assert any(f"{TABLE} rows of call " in line and "ledger row says STARTED" in line
                   for line in report.disagreements), report.lines()
        assert report.exit_code == 1


async def test_through_an_smtp_outage(tmp_path: Path) -> None:
    # The outage is a server that takes connections and never greets: every
    # delivery attempt holds its mail SENDING for the SMTP timeout (2 s),
    # then FAILED, claimed again 0.5 s later. The rolled-back turn's last
    # tool fails just after an attempt claimed its mail, so the compensation
    # meets it SENDING: it waits for the attempt to end and cancels, and the
    # mail never goes.
    mail = Outbox(TABLE, sender=SenderConfig(retry_delays=(0.5,) * 80, smtp_timeout_seconds=2))
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        async with TestStack(build_app(mail), tmp_path, env={"SMTP_PORT": str(port)}) as stack:
            done = await stack.run("notify dee@example.com", approve="bob")
            assert done.status == "completed", done.error
            await wait_until(lambda: task_to(stack.db, "dee@example.com").attempts >= 2,
                             timeout=30, what="the sender failing against the outage")
            undone = await stack.run("notify eve@example.com about ticket midsend",
                                     approve="bob")
            assert undone.status == "rolled_back", undone
            assert undone.tool_calls[0].rolled_back, undone.tool_calls
            eve = task_to(stack.db, "eve@example.com")
            assert eve.status is EmailStatus.CANCELLED, eve
            silent.close()  # the outage ends: a real server on the same port
            with LocalSmtpServer(tmp_path / "mail", port=port):
                await wait_until(lambda: task_to(stack.db, "dee@example.com").status
                                 is EmailStatus.SENT, timeout=30,
                                 what="delivery after the outage")
                await asyncio.sleep(1.5)
            assert task_to(stack.db, "eve@example.com") == eve  # never claimed again
    received = read_mailbox(tmp_path / "mail")
    assert [str(m["To"]) for m in received] == ["dee@example.com"]
    assert str(received[0]["Message-ID"]) == task_to(stack.db, "dee@example.com").message_id


def test_sender_killed_mid_batch_sends_each_mail_at_most_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/notices.db"
    db = Database(url)
    mail = Outbox(TABLE)
    upgrade(db, apps={"notices": mail.tables})
    queued = [mail.enqueue(db, key=f"wf/call-{i}", to=f"p{i}@example.com",
                           subject=f"Notice {i}", body="body")[0] for i in range(30)]
    ids = [t.task_id for t in queued]
    mailbox, port = tmp_path / "mail", free_port()
    env = {"DATABASE_URL": url, "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(port),
           "TURNSTILE_APPS": "tests.support.outbox_app:build_app",
           "TURNSTILE_SENDER_STALE_SECONDS": "1", "TEMPORAL_ADDRESS": "127.0.0.1:1"}

    def settled() -> bool:
        now = [mail.status(db, i) for i in ids]
        return all(t is not None and (t.status is EmailStatus.SENT or t.possibly_sent)
                   for t in now)

    controller = Controller(SlowMailbox(mailbox), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        first = WorkerProcess(tmp_path / "sender1.log", env, ("--sender-only",),
                              ready_marker=b"e-mail sender running (app notices)").start()
        wait_until_sync(lambda: len(read_mailbox(mailbox)) >= 5, timeout=30,
                        what="the sender delivering 5 mails")
        first.kill()
        at_kill = Counter(t.status for t in (mail.status(db, i) for i in ids) if t)
        assert at_kill[EmailStatus.SENT] < 30  # the kill really interrupted the batch
        second = WorkerProcess(tmp_path / "sender2.log", env, ("--sender-only",),
                               ready_marker=b"e-mail sender running (app notices)").start()
        try:
            wait_until_sync(settled, timeout=60, interval=0.1,
                            what="every task settled after the restart")
        finally:
            second.stop()
    finally:
        controller.stop()
    received = Counter(str(m["Message-ID"]) for m in read_mailbox(mailbox))
    for task_id in ids:
        task = mail.status(db, task_id)
        assert task is not None
        copies = received[task.message_id]
        if task.status is EmailStatus.SENT:
            assert copies == 1, f"{task_id} SENT but received {copies} times"
        else:  # lost mid-send: parked for a person, delivered at most once
            assert task.possibly_sent and copies <= 1
    assert sum(received.values()) == len(received)  # no Message-ID arrived twice


def test_make_up_starts_the_local_smtp_server_for_an_outbox_app(tmp_path: Path) -> None:
    port = free_port()
    app = build_app()
    remote = Settings(smtp_host="mail.example.net", smtp_port=port, data_dir=tmp_path)
    assert dev_services_of([app], remote) == []  # SMTP elsewhere: nothing to start
    settings = Settings(smtp_host="127.0.0.1", smtp_port=port, data_dir=tmp_path)
    [smtp] = dev_services_of([app], settings)
    assert (smtp.name, smtp.port) == ("smtp", port)
    assert "turnstile.outbox.smtp_server" in smtp.command
    stack = Stack(settings, [smtp])
    stack._start_dev_service(smtp)  # what `up` does for each dev service
    try:
        assert answers("127.0.0.1", port)
        db = Database(f"sqlite:///{tmp_path}/up.db")
        mail = Outbox(TABLE)
        upgrade(db, apps={"notices": mail.tables})
        task, _ = mail.enqueue(db, key="up-1", to="fay@example.com", subject="Up", body="b")
        assert deliver_due(mail.store, db, settings) == 1
        [received] = read_mailbox(tmp_path / "mail")  # where the dev service keeps mail
        assert str(received["Message-ID"]) == task.message_id
    finally:
        stack._stop("smtp")
    deadline = time.monotonic() + 10
    while answers("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not answers("127.0.0.1", port)


def test_two_apps_share_one_outbox_table(tmp_path: Path) -> None:
    """Apps that name the same table share it: made once, one state machine."""
    first, second = Outbox("shared_mail"), Outbox("shared_mail")
    assert first.table is second.table
    db = Database(f"sqlite:///{tmp_path}/shared.db")
    upgrade(db, apps={"one": first.tables, "two": second.tables})
    task, created = first.enqueue(db, key="k-1", to="hal@example.com", subject="s", body="b")
    again, created_again = second.enqueue(db, key="k-1", to="hal@example.com", subject="s",
                                          body="b")
    assert (created, created_again, again.task_id) == (True, False, task.task_id)
    assert isinstance(second.cancel(db, task.task_id), str)
    now = first.status(db, task.task_id)
    assert now is not None and now.status is EmailStatus.CANCELLED
