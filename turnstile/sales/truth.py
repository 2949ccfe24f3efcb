"""The truth check with the reference service's world tables: a follow-up
or e-mail that memory says exists, or says was rolled back, against
`follow_up_task` and `email_task` (with its delivery state); and the other
way round, an effect of a turn's call whose ledger row never completed (the
effect committed, its record did not: what the call journal's transaction
rules out)."""

from __future__ import annotations

import sqlalchemy as sa

from turnstile.engine import attributes as attr
from turnstile.sales.outbox import EmailStatus
from turnstile.sales.schema import email_task, follow_up_task
from turnstile.stores import truth
from turnstile.stores.audit import execution_id, tool_execution_log
from turnstile.stores.db import Database
from turnstile.stores.ledger import tool_call_ledger


def disagreements(db: Database, conversation_id: str | None = None,
                  busy: set[str] | None = None) -> list[str]:
    """turnstile.stores.truth.disagreements and the world tables' (`busy`:
    the conversations to skip; default every locked one)."""
    busy = truth.busy_conversations(db) if busy is None else busy
    found = truth.disagreements(db, conversation_id, busy)
    with db.connect() as conn:
        follow_ups: dict[str, list[str]] = {}
        for call, status in conn.sa.execute(
                sa.select(follow_up_task.c.created_by_call, follow_up_task.c.status)):
            follow_ups.setdefault(str(call), []).append(str(status))
        mails = {str(key): str(status) for key, status in conn.sa.execute(
            sa.select(email_task.c.idempotency_key, email_task.c.status))}
    found += _unrecorded(db, conversation_id, busy, {
        "follow_up_task": set(follow_ups), "email_task": set(mails)})
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


def _unrecorded(db: Database, conversation_id: str | None, busy: set[str],
                effects: dict[str, set[str]]) -> list[str]:
    """World rows made by a turn's call (keyed by its idempotency key) whose
    ledger row is not COMPLETED. Rows whose key no ledger row has were made
    outside a turn (a tool called directly) and are left alone."""
    led, log = tool_call_ledger.c, tool_execution_log.c
    with db.connect() as conn:
        ledger = {execution_id(workflow, call, chain): str(status)
                  for workflow, chain, call, status in conn.sa.execute(sa.select(
                      led.workflow_id, led.execution_chain, led.tool_call_id, led.status))}
        conversation = {str(execution): str(conv) for execution, conv in conn.sa.execute(
            sa.select(log.execution_id, log.conversation_id))}
    found = []
    for table, keys in effects.items():
        for key in sorted(keys):
            status = ledger.get(key)
            conv = conversation.get(key)
            if status in (None, "COMPLETED") or conv in busy or (
                    conversation_id is not None and conv != conversation_id):
                continue
            found.append(f"conversation {conv or '?'}: {table} rows of call {key} exist; its "
                         f"ledger row says {status} (the effect has no record)")
    return found
