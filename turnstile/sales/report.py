"""What a sales-assistant turn did to the world, for the `make run` demo:
e-mail tasks (waiting briefly for the sender), the mails on disk, follow-up
rows and the audit log."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import sqlalchemy as sa

from turnstile.sales.outbox import EmailStatus
from turnstile.sales.schema import email_task, follow_up_task
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database

SETTLED = {EmailStatus.SENT, EmailStatus.DEAD, EmailStatus.CANCELLED, EmailStatus.FAILED}


class _Mail(NamedTuple):
    task_id: str
    recipient: str
    subject: str
    status: str
    attempts: int
    message_id: str


class _FollowUp(NamedTuple):
    customer_id: str
    assignee: str
    status: str


_MAILS = sa.select(email_task.c.task_id, email_task.c.recipient, email_task.c.subject,
                   email_task.c.status, email_task.c.attempts, email_task.c.message_id)
_FOLLOW_UPS = sa.select(follow_up_task.c.customer_id, follow_up_task.c.assignee,
                        follow_up_task.c.status)


def report_effects(db: Database, workflow_id: str, mail_dir: Path, out: Callable[[str], None],
                   wait_seconds: float = 20.0) -> None:
    key = workflow_id + "/%"
    deadline = time.monotonic() + wait_seconds
    while True:
        with db.connect() as conn:
            tasks = [_Mail._make(r) for r in conn.execute(
                _MAILS.where(email_task.c.idempotency_key.like(key))
                .order_by(email_task.c.created_at))]
        if all(t.status in SETTLED for t in tasks) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    with db.connect() as conn:
        follow_ups = [_FollowUp._make(r) for r in conn.execute(
            _FOLLOW_UPS.where(follow_up_task.c.created_by_call.like(key))
            .order_by(follow_up_task.c.id))]
    out("effects:")
    out(f"  follow-up tasks: {len(follow_ups)} "
        + ", ".join(f"{f.customer_id}->{f.assignee} [{f.status}]" for f in follow_ups))
    for t in tasks:
        out(f"  e-mail {t.task_id} to {t.recipient}: {t.status} "
            f"(attempts {t.attempts}) \"{t.subject}\"")
        if t.status == EmailStatus.SENT and mail_dir.exists():
            mid = (t.message_id or "").strip("<>")
            files = [p for p in sorted(mail_dir.glob("*.eml"))
                     if mid and mid in p.read_text(errors="replace")]
            for p in files:
                out(f"    received by the local SMTP server: {p}")
    out("  audit log (tool_execution_log):")
    for row in AuditLog(db).rows(workflow_id):
        out(f"    {row.tool_name:<20} {row.status:<20} {(row.input_params or '')[:90]}")
