"""The truth check with the reference service's world tables: a follow-up
or e-mail that memory says exists, or says was rolled back, against
`follow_up_task` and `email_task` (with its delivery state); and the other
way round, an effect of a turn's call whose ledger row never completed (the
effect committed, its record did not: what the call journal's transaction
rules out). Every other outbox table of the served apps (the public outbox,
turnstile.outbox) is compared by the call keys its rows carry:
`outbox_disagreements`."""

from __future__ import annotations

from collections.abc import Iterable

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
    follow_ups: dict[str, list[str]] = {}
    mails: dict[str, str] = {}
    with db.connect() as conn:
        # A database the sales app is not served on has neither table.
        present = set(sa.inspect(conn.sa).get_table_names())
        if follow_up_task.name in present:
            for call, status in conn.sa.execute(
                    sa.select(follow_up_task.c.created_by_call, follow_up_task.c.status)):
                follow_ups.setdefault(str(call), []).append(str(status))
        if email_task.name in present:
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


def outbox_tables(tables: Iterable[sa.Table]) -> list[sa.Table]:
    """The public outbox's tables (turnstile.outbox.table) among `tables`,
    but `email_task`, which `disagreements` compares call by call."""
    seen: dict[str, sa.Table] = {}
    for t in tables:
        if t.info.get("outbox") and t.name != email_task.name:
            seen.setdefault(t.name, t)  # two apps may share one outbox table
    return [seen[name] for name in sorted(seen)]


def outbox_disagreements(db: Database, tables: Iterable[sa.Table],
                         conversation_id: str | None = None,
                         busy: set[str] | None = None) -> list[str]:
    """Every outbox table of the served apps against the call journal and
    memory. A row is keyed by the idempotency key of the call that queued it
    (`Outbox.enqueue` in a tool), so without knowing which tool queues where:
    a row of a call whose ledger row did not complete (the effect has no
    record), and a row of a call memory says was rolled back that is not
    CANCELLED (the mail went, or may go, out). A call that says it queued
    but has no row is named only for `email_task`: which tool writes which
    outbox is the app's own."""
    busy = truth.busy_conversations(db) if busy is None else busy
    keyed: dict[str, dict[str, str]] = {}
    with db.connect() as conn:
        present = set(sa.inspect(conn.sa).get_table_names())
        for t in outbox_tables(tables):
            if t.name not in present:  # an app served before its tables were made
                continue
            keyed[t.name] = {str(key): str(status) for key, status in conn.sa.execute(
                sa.select(t.c.idempotency_key, t.c.status))}
    if not keyed:
        return []
    found = _unrecorded(db, conversation_id, busy, {n: set(k) for n, k in keyed.items()})
    for r in truth.tool_results(db, conversation_id):
        if r.conversation_id in busy or not r.attributes.get(attr.ROLLED_BACK):
            continue
        for name, statuses in sorted(keyed.items()):
            status = statuses.get(r.key)
            if status not in (None, EmailStatus.CANCELLED.value):
                found.append(f"conversation {r.conversation_id}: call {r.call_id} "
                             f"({r.tool_name}) of turn {r.workflow_id}: rolled back in "
                             f"memory; its mail in {name} is {status}")
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
