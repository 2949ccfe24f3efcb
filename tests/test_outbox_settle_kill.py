"""A worker SIGKILLed while a compensation of the public outbox waits for a
delivery attempt to end (`Outbox.cancel` meets its mail SENDING and waits,
outside the call journal's transaction). Real processes: a `python worker.py
--no-sender` serving the tests' notices app (tests/support/outbox_app.py), a
`--sender-only` process delivering through an SMTP outage (a server that
takes connections and never greets: every attempt holds the mail SENDING for
2 s, then FAILED, claimed again 0.5 s later); SQLite and PostgreSQL.

The compensation's heartbeat timeout ends the lost attempt; the next worker
runs it again, it waits for the attempt of the moment to end and cancels the
mail: the turn is rolled back, the mail CANCELLED once (one ROLLED_BACK audit
row, one compensation record), and when the SMTP server is back nothing is
ever delivered for it."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowHandle

from tests.support.outbox_app import build_outage_app
from tests.support.temporal_server import DevServer
from tests.support.turns import wait_pending
from tests.support.waiting import wait_until
from tests.support.worker_loss import activity_runs, after_heartbeat_timeout
from tests.support.worker_process import WorkerProcess
from tests.test_public_outbox import task_to
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import COMPENSATE_TOOL
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    CallStatus,
    TurnInput,
    TurnResult,
    TurnStatus,
)
from turnstile.outbox import EmailStatus
from turnstile.outbox.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.sales.check import check
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore

APP = "tests.support.outbox_app:build_outage_app"


async def _compensating(handle: WorkflowHandle) -> bool:
    """The turn's compensation has started on a worker."""
    described = await handle.describe()
    return any(a.activity_type.name == COMPENSATE_TOOL
               and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
               for a in described.raw_description.pending_activities)


async def test_worker_killed_while_a_compensation_waits_for_a_delivery_attempt(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        db: Database) -> None:
    conv, wf_id = f"c-midsend-{task_queue}", f"midsend-{task_queue}"
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        env = {"DATABASE_URL": db.url, "TEMPORAL_ADDRESS": temporal_server.address,
               "TURNSTILE_TASK_QUEUE": task_queue, "TURNSTILE_APPS": APP,
               "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(port), "LLM_BASE_URL": ""}
        worker = WorkerProcess(tmp_path / "worker1.log", env)
        sender = WorkerProcess(tmp_path / "sender.log", env, ("--sender-only",),
                               ready_marker=b"e-mail sender running (app notices)")
        try:
            await asyncio.gather(asyncio.to_thread(worker.start),
                                 asyncio.to_thread(sender.start))
            handle = await client.start_workflow(
                WORKFLOW_TYPE, TurnInput(conversation_id=conv, user_id="alice",
                                         message="notify eve@example.com about ticket midsend",
                                         service="notices"),
                id=wf_id, task_queue=task_queue, result_type=TurnResult)
            [pending] = await wait_pending(handle)
            await handle.signal("approve", ApproveSignal(tool_call_id=pending.tool_call_id,
                                                         reviewer="bob"))
            # closeTicket fails just after an attempt claimed the mail: the
            # compensation meets it SENDING and waits for the attempt to end.
            try:
                await wait_until(lambda: _compensating(handle), timeout=30,
                                 what="the compensation never started")
                meets = task_to(db, "eve@example.com")
                assert meets.status is EmailStatus.SENDING, meets
                await asyncio.sleep(0.3)
                waiting = task_to(db, "eve@example.com")
                assert waiting == meets  # the same attempt, still under way
            finally:
                worker.kill()  # SIGKILL while the compensation waits
            # Not cancelled by the lost attempt, and its undo not recorded.
            assert task_to(db, "eve@example.com").status is not EmailStatus.CANCELLED
            assert [r.status.value for r in AuditLog(db).rows(wf_id)
                    if r.tool_name == "sendNotice"] == ["COMPLETED"]
            worker = WorkerProcess(tmp_path / "worker2.log", env).start()
            result = await asyncio.wait_for(handle.result(), timeout=35)
            eve = task_to(db, "eve@example.com")
            worker.stop()
            silent.close()  # the outage ends: a real server on the same port
            with LocalSmtpServer(tmp_path / "mail", port=port):
                # The sender keeps passing (every 0.5 s): nothing goes out for eve.
                await asyncio.sleep(2.0)
        finally:
            worker.stop()
            sender.stop()
    assert result.status == TurnStatus.ROLLED_BACK, result
    send = result.tool_calls[0]
    assert send.name == "sendNotice" and send.status == CallStatus.ROLLED_BACK, send
    [(scheduled, started)] = await activity_runs(handle, COMPENSATE_TOOL)
    after_heartbeat_timeout(scheduled, started)
    assert eve.status is EmailStatus.CANCELLED and not eve.possibly_sent, eve
    assert eve.attempts >= meets.attempts
    assert task_to(db, "eve@example.com") == eve  # never claimed again
    assert read_mailbox(tmp_path / "mail") == []
    assert [r.status.value for r in AuditLog(db).rows(wf_id)
            if r.tool_name == "sendNotice"] == ["ROLLED_BACK"]
    [undone] = [m for m in MemoryStore(db).messages(conv) if m.tool_call_id == send.id]
    assert undone.attributes.get(attr.ROLLED_BACK)
    assert (undone.content or "").count("cancelled before it was sent") == 1, undone.content

    async def temporal() -> Client:
        return client

    report = await check(db, temporal, tables=build_outage_app().tables)
    assert report.disagreements == [] and report.exit_code == 0, report.lines()
