"""The truth check of memory against the journal (ledger, audit, approvals):
what `python starter.py check` prints (the reference service adds its world
tables: turnstile.sales.truth). Meant for a quiet system: conversations a
running turn holds are skipped (their calls may be in flight). Which holders
run is Temporal's to say (turnstile.runtime.holders): the caller passes the
conversations to skip as `busy`; without it every locked conversation is
skipped. A conversation whose holder ended (terminated, lost, reset away)
keeps its lock row until its next turn takes it over and repairs what the
ended turn left (`awaiting_repair`; turnstile.stores.journal.repair_orphans).

Memory is `chat_message`: messages a reset run superseded are not in it, so
they are checked only for what they may leave behind — an effect of a
superseded call that remains must be flagged on its kept result
(`turnstile.superseded_effect`, turnstile.stores.superseded). Flagged effects
are not disagreements: `notes` lists them for a person to look at."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

import sqlalchemy as sa

from turnstile.engine import attributes as attr
from turnstile.engine.contract import AuditStatus, CallStatus
from turnstile.engine.messages import ToolCall
from turnstile.stores import grant_store, superseded
from turnstile.stores.audit import execution_id, tool_execution_log
from turnstile.stores.connection import Connection
from turnstile.stores.damage import message_damage
from turnstile.stores.db import Database
from turnstile.stores.journal import open_calls
from turnstile.stores.ledger import tool_call_ledger
from turnstile.stores.lock import Holder, locks
from turnstile.stores.memory import MessageRow, chat_message, load_attributes

m = chat_message.c
log = tool_execution_log.c
ledger_c = tool_call_ledger.c


@dataclass(frozen=True)
class ToolResultRow:
    """A stored tool result and the keys of the call it answers."""

    conversation_id: str
    workflow_id: str
    chain: str
    call_id: str
    tool_name: str
    outcome: str
    attributes: dict[str, Any]

    @property
    def key(self) -> str:
        """The call's idempotency key (turnstile.runtime.tools.ToolContext)."""
        return execution_id(self.workflow_id, self.call_id, self.chain)

    @property
    def claims_effect(self) -> bool:
        """Memory says the call took effect and still stands."""
        a = self.attributes
        return (self.outcome == CallStatus.COMPLETED.value and not a.get(attr.ROLLED_BACK)
                and not a.get(attr.EFFECT_MAY_REMAIN))


class _Audited(NamedTuple):
    """What the check reads of a `tool_execution_log` row."""

    execution_id: str
    conversation_id: str
    tool_name: str
    status: str


class _Ledgered(NamedTuple):
    """What the check reads of a `tool_call_ledger` row."""

    workflow_id: str
    execution_chain: str
    tool_call_id: str
    status: str


def _of(column: sa.ColumnElement[Any], conversation_id: str | None) -> list[sa.ColumnElement[bool]]:
    """The condition "of this conversation" (none: of every conversation)."""
    return [] if conversation_id is None else [column == conversation_id]


def _messages(conn: Connection, conversation_id: str | None) -> list[MessageRow]:
    """Read tolerantly: a damaged row (turnstile.stores.damage) is the check's
    to name (`damaged`), its conversation skipped by the caller."""
    with conn.tolerant():
            return conn.rows(sa.select(chat_message).where(*_of(m.conversation_id,
                                                            conversation_id))
                         .order_by(m.conversation_id, m.seq), MessageRow)


def _audit_rows(conn: Connection, *where: sa.ColumnElement[bool]) -> list[_Audited]:
    return conn.rows(sa.select(log.execution_id, log.conversation_id, log.tool_name, log.status)
                     .where(*where).order_by(log.start_time), _Audited)


def _unanswered(rows: list[MessageRow]) -> list[tuple[str | None, ToolCall]]:
    """(turn, call) of every call in `rows` (one conversation) left without a
    result (turnstile.stores.journal.open_calls)."""
    return [(owner.workflow_id, c) for owner, calls, _ in open_calls(rows) for c in calls]


def busy_conversations(db: Database) -> set[str]:
    with db.connect() as conn:
        return {lock.conversation_id for lock in locks(conn)}


def lock_holders(db: Database, conversation_id: str | None = None) -> dict[str, Holder]:
    """Each locked conversation's holder (turnstile.stores.lock)."""
    with db.connect() as conn:
        return {lock.conversation_id: lock.holder for lock in locks(conn, conversation_id)}


@dataclass(frozen=True)
class AwaitingRepair:
    """What a turn that ended without running its own code left in a
    conversation, for the next turn's memory load to repair."""

    calls: list[str]  # "call_1 (sendMoney) of turn t-1": calls without a result
    audit_rows: list[str]  # "<execution id> (sendMoney)": audit rows left INITIATED

    def __bool__(self) -> bool:
        return bool(self.calls or self.audit_rows)


def awaiting_repair(db: Database, conversation_id: str) -> AwaitingRepair:
    with db.connect() as conn:
        rows = _messages(conn, conversation_id)
        audit = _audit_rows(conn, log.conversation_id == conversation_id,
                            log.status == AuditStatus.INITIATED.value)
    return AwaitingRepair(
        calls=[f"{c.id} ({c.name}) of turn {wf}" for wf, c in _unanswered(rows)],
        audit_rows=[f"{r.execution_id} ({r.tool_name})" for r in audit])


def tool_results(db: Database, conversation_id: str | None) -> list[ToolResultRow]:
    with db.connect() as conn, conn.tolerant():
        rows = conn.rows(sa.select(m.conversation_id, m.seq, m.role, m.workflow_id,
                                   m.execution_chain, m.tool_call_id, m.attributes)
                         .where(m.role == "tool", *_of(m.conversation_id, conversation_id))
                         .order_by(m.conversation_id, m.seq), MessageRow)
    out = []
    for r in rows:
        if message_damage(r._asdict()) is not None:
            continue  # named by `damaged`; nothing to compare
        a = load_attributes(r.attributes)
        out.append(ToolResultRow(
            conversation_id=r.conversation_id, workflow_id=r.workflow_id or "",
            chain=r.execution_chain or "", call_id=r.tool_call_id or "",
            tool_name=str(a.get(attr.TOOL_NAME, "")), outcome=str(a.get(attr.OUTCOME, "")),
            attributes=a))
    return out


def disagreements(db: Database, conversation_id: str | None = None,
                  busy: set[str] | None = None) -> list[str]:
    """Every disagreement between memory, ledger and audit log, as sentences,
    outside the conversations in `busy` (default: every locked one)."""
    busy = busy_conversations(db) if busy is None else busy
    found: list[str] = []
    with db.connect() as conn:
        messages = _messages(conn, conversation_id)
        ledger = {(r.workflow_id, r.execution_chain, r.tool_call_id): r.status
                  for r in conn.rows(sa.select(ledger_c.workflow_id, ledger_c.execution_chain,
                                               ledger_c.tool_call_id, ledger_c.status),
                                     _Ledgered)}
        audit = {r.execution_id: r
                 for r in _audit_rows(conn, *_of(log.conversation_id, conversation_id))}
    by_conv: dict[str, list[MessageRow]] = {}
    for msg in messages:
        by_conv.setdefault(msg.conversation_id, []).append(msg)
    for conv, rows in by_conv.items():
        if conv in busy:
            continue
        for wf, c in _unanswered(rows):
            found.append(f"conversation {conv}: call {c.id} ({c.name}) of turn "
                         f"{wf} has no result in memory")
    results = [r for r in tool_results(db, conversation_id) if r.conversation_id not in busy]
    twice = Counter((r.conversation_id, r.workflow_id, r.chain, r.call_id) for r in results)
    for (conv, wf, _, call), n in twice.items():
        if n > 1:
            found.append(f"conversation {conv}: call {call} of turn {wf} has {n} results")
    for r in results:
        if r.claims_effect and r.attributes.get(attr.REPAIRED) is None and ledger.get(
                (r.workflow_id, r.chain, r.call_id)) != "COMPLETED":
            found.append(f"conversation {r.conversation_id}: memory says call {r.call_id} "
                         f"({r.tool_name}) of turn {r.workflow_id} completed; the ledger "
                         "has no completed row")
        row = audit.get(r.key)
        if r.attributes.get(attr.ROLLED_BACK) and (
                row is None or row.status != AuditStatus.ROLLED_BACK.value):
            found.append(f"conversation {r.conversation_id}: memory says call {r.call_id} "
                         f"({r.tool_name}) was rolled back; the audit log says "
                         f"{row.status if row else 'nothing'}")
    for key, row in audit.items():
        if row.status == AuditStatus.INITIATED.value and row.conversation_id not in busy:
            found.append(f"conversation {row.conversation_id}: audit row {key} "
                         f"({row.tool_name}) was left open (INITIATED)")
    found += [line for line, flagged in _superseded(db, conversation_id, busy) if not flagged]
    with db.connect() as conn:
        found += grant_disagreements(conn, conversation_id, busy)
    return found


def grant_disagreements_of(db: Database, conversation_id: str | None = None,
                           busy: set[str] | None = None) -> list[str]:
    """`grant_disagreements` in a transaction of its own."""
    with db.connect() as conn:
        return grant_disagreements(conn, conversation_id, busy or set())


def grant_disagreements(conn: Connection, conversation_id: str | None,
                        busy: set[str]) -> list[str]:
    """Standing approvals against the audit log: every use of a grant
    (`grant_use`) has its call's audit row naming the grant, every audit row
    naming a grant has that use, and each grant's count is its uses."""
    found: list[str] = []
    uses = [r for r in grant_store.uses(conn, conversation_id) if r.conversation_id not in busy]
    named = {str(r["execution_id"]): (str(r["grant_id"]), str(r["conversation_id"]),
                                      str(r["tool_name"])) for r in conn.execute(
        sa.select(log.execution_id, log.grant_id, log.conversation_id, log.tool_name).where(
            log.grant_id.is_not(None), *_of(log.conversation_id, conversation_id))).mappings()}
    used = set()
    for use in uses:
        key = execution_id(use.workflow_id, use.tool_call_id, use.execution_chain)
        used.add((key, use.grant_id))
        row = named.get(key)
        if row is None or row[0] != use.grant_id:
            says = f"names grant {row[0]}" if row else "has no audit row naming it"
            found.append(f"conversation {use.conversation_id}: grant {use.grant_id} was used "
                         f"by call {use.tool_call_id} of turn {use.workflow_id}, which {says}")
    for key, (grant_id, conv, tool_name) in named.items():
        if conv not in busy and (key, grant_id) not in used:
            found.append(f"conversation {conv}: audit row {key} ({tool_name}) names grant "
                         f"{grant_id}, which has no use by that call")
    if conversation_id is None:
        per_grant = Counter(use.grant_id for use in grant_store.uses(conn))
        for grant_id, count in grant_store.counts(conn).items():
            if count != per_grant.get(grant_id, 0):
                found.append(f"grant {grant_id} counts {count} use(s); grant_use holds "
                             f"{per_grant.get(grant_id, 0)}")
    return found


def notes(db: Database, conversation_id: str | None = None,
          busy: set[str] | None = None) -> list[str]:
    """Effects of superseded calls that remain (or may) and are flagged as
    such: consistent, but the world holds something the conversation no
    longer says; a person decides whether to undo it."""
    busy = busy_conversations(db) if busy is None else busy
    return [line for line, flagged in _superseded(db, conversation_id, busy) if flagged]


def _superseded(db: Database, conversation_id: str | None,
                busy: set[str]) -> list[tuple[str, bool]]:
    """(sentence, flagged?) for each superseded call whose effect remains or may."""
    out = []
    with db.connect() as conn:
        for sc in superseded.all_calls(conn, conversation_id):
            if sc.conversation_id in busy:
                continue
            effect, _ = superseded.judge(conn, sc)
            if effect not in (superseded.Effect.REMAINS, superseded.Effect.UNKNOWN):
                continue
            marker = sc.marker or {}
            where = (f"conversation {sc.conversation_id}: call {sc.call.id} ({sc.call.name}) of "
                     f"turn {sc.workflow_id}, superseded by reset run {sc.superseded_by}")
            if marker.get("effect") in (superseded.Effect.REMAINS, superseded.Effect.UNKNOWN):
                verb = "remains" if effect is superseded.Effect.REMAINS else "may remain"
                out.append((f"{where}: its effect {verb} (the reset run did not make this "
                            "call again)", True))
            else:
                verb = "remains" if effect is superseded.Effect.REMAINS else "may remain"
                out.append((f"{where}: its effect {verb} and memory does not say so "
                            f"(no {attr.SUPERSEDED_EFFECT} on its kept result)", False))
    return out
