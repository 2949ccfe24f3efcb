"""What a sales-assistant turn did to the world, for the `make run` demo:
e-mail tasks (waiting briefly for the sender), the mails on disk, follow-up
rows and the audit log."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from turnstile.sales.outbox import EmailStatus
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database

SETTLED = {EmailStatus.SENT, EmailStatus.DEAD, EmailStatus.CANCELLED, EmailStatus.FAILED}


def report_effects(db: Database, workflow_id: str, mail_dir: Path, out: Callable[[str], None],
                   wait_seconds: float = 20.0) -> None:
    key = workflow_id + "/%"
    deadline = time.monotonic() + wait_seconds
    while True:
        with db.connect() as conn:
            tasks = conn.fetchall("SELECT task_id, recipient, subject, status, attempts, "
                                  "message_id FROM email_task WHERE idempotency_key LIKE :key "
                                  "ORDER BY created_at", {"key": key})
        if all(t["status"] in SETTLED for t in tasks) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    with db.connect() as conn:
        follow_ups = conn.fetchall("SELECT customer_id, assignee, status FROM follow_up_task "
                                   "WHERE created_by_call LIKE :key ORDER BY id", {"key": key})
    out("effects:")
    out(f"  follow-up tasks: {len(follow_ups)} "
        + ", ".join(f"{f['customer_id']}->{f['assignee']} [{f['status']}]" for f in follow_ups))
    for t in tasks:
        out(f"  e-mail {t['task_id']} to {t['recipient']}: {t['status']} "
            f"(attempts {t['attempts']}) \"{t['subject']}\"")
        if t["status"] == EmailStatus.SENT and mail_dir.exists():
            mid = (t["message_id"] or "").strip("<>")
            files = [p for p in sorted(mail_dir.glob("*.eml"))
                     if mid and mid in p.read_text(errors="replace")]
            for p in files:
                out(f"    received by the local SMTP server: {p}")
    out("  audit log (tool_execution_log):")
    for row in AuditLog(db).rows(workflow_id):
        out(f"    {row.tool_name:<20} {row.status:<20} {(row.input_params or '')[:90]}")
