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

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from turnstile.engine import attributes as attr
from turnstile.engine.contract import AuditStatus, CallStatus
from turnstile.stores import superseded
from turnstile.stores.audit import execution_id
from turnstile.stores.db import Database
from turnstile.stores.journal import open_calls
from turnstile.stores.lock import Holder


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


def _where(conversation_id: str | None) -> tuple[str, dict[str, Any]]:
    if conversation_id is None:
        return "", {}
    return " AND conversation_id = :c", {"c": conversation_id}


def busy_conversations(db: Database) -> set[str]:
    with db.connect() as conn:
        return {r["conversation_id"] for r in conn.fetchall(
            "SELECT conversation_id FROM conversation_lock")}


def lock_holders(db: Database, conversation_id: str | None = None) -> dict[str, Holder]:
    """Each locked conversation's holder (turnstile.stores.lock)."""
    where, params = _where(conversation_id)
    with db.connect() as conn:
        return {r["conversation_id"]: Holder(r["workflow_id"], r["run_id"],
                                             r["execution_chain"])
                for r in conn.fetchall("SELECT conversation_id, workflow_id, run_id, "
                                       "execution_chain FROM conversation_lock WHERE 1 = 1"
                                       + where, params)}


@dataclass(frozen=True)
class AwaitingRepair:
    """What a turn that ended without running its own code left in a
    conversation, for the next turn's memory load to repair."""

    calls: list[str]  # "call_1 (sendMoney) of turn t-1": calls without a result
    audit_rows: list[str]  # "<execution id> (sendMoney)": audit rows left INITIATED

    def __bool__(self) -> bool:
        return bool(self.calls or self.audit_rows)


def awaiting_repair(db: Database, conversation_id: str) -> AwaitingRepair:
    params = {"c": conversation_id}
    with db.connect() as conn:
        rows = conn.fetchall("SELECT * FROM chat_message WHERE conversation_id = :c "
                             "ORDER BY seq", params)
        audit = conn.fetchall("SELECT execution_id, tool_name FROM tool_execution_log "
                              "WHERE conversation_id = :c AND status = :s ORDER BY start_time",
                              {**params, "s": AuditStatus.INITIATED.value})
    return AwaitingRepair(
        calls=[f"{c.id} ({c.name}) of turn {owner['workflow_id']}"
               for owner, calls, _ in open_calls(rows) for c in calls],
        audit_rows=[f"{r['execution_id']} ({r['tool_name']})" for r in audit])


def tool_results(db: Database, conversation_id: str | None) -> list[ToolResultRow]:
    where, params = _where(conversation_id)
    with db.connect() as conn:
        rows = conn.fetchall("SELECT conversation_id, workflow_id, execution_chain, "
                             "tool_call_id, attributes FROM chat_message WHERE role = 'tool'"
                             + where + " ORDER BY conversation_id, seq", params)
    out = []
    for r in rows:
        a = json.loads(r["attributes"]) if r["attributes"] else {}
        out.append(ToolResultRow(
            conversation_id=r["conversation_id"], workflow_id=r["workflow_id"] or "",
            chain=r["execution_chain"] or "", call_id=r["tool_call_id"] or "",
            tool_name=str(a.get(attr.TOOL_NAME, "")), outcome=str(a.get(attr.OUTCOME, "")),
            attributes=a))
    return out


def disagreements(db: Database, conversation_id: str | None = None,
                  busy: set[str] | None = None) -> list[str]:
    """Every disagreement between memory, ledger and audit log, as sentences,
    outside the conversations in `busy` (default: every locked one)."""
    busy = busy_conversations(db) if busy is None else busy
    found: list[str] = []
    where, params = _where(conversation_id)
    with db.connect() as conn:
        messages = conn.fetchall("SELECT * FROM chat_message WHERE 1 = 1" + where
                                 + " ORDER BY conversation_id, seq", params)
        ledger = {(r["workflow_id"], r["execution_chain"], r["tool_call_id"]): r["status"]
                  for r in conn.fetchall("SELECT workflow_id, execution_chain, tool_call_id, "
                                         "status FROM tool_call_ledger")}
        audit = {r["execution_id"]: r for r in conn.fetchall(
            "SELECT execution_id, conversation_id, tool_name, status FROM tool_execution_log"
            " WHERE 1 = 1" + where, params)}
    by_conv: dict[str, list[dict[str, Any]]] = {}
    for m in messages:
        by_conv.setdefault(m["conversation_id"], []).append(m)
    for conv, rows in by_conv.items():
        if conv in busy:
            continue
        for owner, calls, _ in open_calls(rows):
            for c in calls:
                found.append(f"conversation {conv}: call {c.id} ({c.name}) of turn "
                             f"{owner['workflow_id']} has no result in memory")
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
                row is None or row["status"] != AuditStatus.ROLLED_BACK.value):
            found.append(f"conversation {r.conversation_id}: memory says call {r.call_id} "
                         f"({r.tool_name}) was rolled back; the audit log says "
                         f"{row['status'] if row else 'nothing'}")
    for key, row in audit.items():
        if row["status"] == AuditStatus.INITIATED.value and row["conversation_id"] not in busy:
            found.append(f"conversation {row['conversation_id']}: audit row {key} "
                         f"({row['tool_name']}) was left open (INITIATED)")
    found += [line for line, flagged in _superseded(db, conversation_id, busy) if not flagged]
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
