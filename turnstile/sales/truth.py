"""The truth check with the reference service's world tables: a follow-up
or e-mail that memory says exists, or says was rolled back, against
`follow_up_task` and `email_task` (with its delivery state)."""

from __future__ import annotations

from turnstile.engine import attributes as attr
from turnstile.sales.outbox import EmailStatus
from turnstile.stores import truth
from turnstile.stores.db import Database


def disagreements(db: Database, conversation_id: str | None = None) -> list[str]:
    found = truth.disagreements(db, conversation_id)
    busy = truth.busy_conversations(db)
    with db.connect() as conn:
        follow_ups: dict[str, list[str]] = {}
        for f in conn.fetchall("SELECT created_by_call, status FROM follow_up_task"):
            follow_ups.setdefault(f["created_by_call"], []).append(f["status"])
        mails = {m["idempotency_key"]: m["status"] for m in conn.fetchall(
            "SELECT idempotency_key, status FROM email_task")}
    for r in truth.tool_results(db, conversation_id):
        if r.conversation_id in busy:
            continue
        where = f"conversation {r.conversation_id}: call {r.call_id} ({r.tool_name}) of turn " \
                f"{r.workflow_id}"
        rolled_back = bool(r.attributes.get(attr.ROLLED_BACK))
        if r.tool_name == "createFollowUpTask":
            statuses = follow_ups.get(r.key, [])
            if r.claims_effect and not statuses:
                found.append(f"{where}: memory says created; no follow_up_task row")
            if rolled_back and any(s != "CANCELLED" for s in statuses):
                found.append(f"{where}: rolled back in memory; follow-up tasks still "
                             f"{sorted(set(statuses))}")
        elif r.tool_name == "createEmailTask":
            status = mails.get(r.key)
            if r.claims_effect and status is None:
                found.append(f"{where}: memory says queued; no email_task row")
            if rolled_back and status not in (None, EmailStatus.CANCELLED.value):
                found.append(f"{where}: rolled back in memory; the e-mail is {status}")
    return found
