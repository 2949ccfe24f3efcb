"""The call journal's statements: every INSERT and UPDATE of the call facts —
`tool_call_ledger` (turnstile.stores.ledger), `tool_execution_log` and
`approval_decision` (turnstile.stores.audit) — is one of these, run by the
call journal (turnstile.stores.journal) in the transaction of the ending it
records. No other module writes those tables (tests/test_one_writer.py).

Each runs in the caller's transaction (`conn`), on SQLite and PostgreSQL; an
upsert is the dialect's INSERT ... ON CONFLICT.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from turnstile.engine.contract import ApprovalDecision, AuditStatus, CallStatus
from turnstile.engine.flow import Provenance
from turnstile.stores.audit import (
    approval_decision,
    mask,
    masked_params,
    provenance_text,
    tool_execution_log,
)
from turnstile.stores.call_key import CallKey
from turnstile.stores.connection import Connection
from turnstile.stores.ledger import LedgerRow, LedgerStatus, tool_call_ledger
from turnstile.stores.memory import now_iso
from turnstile.stores.prebuilt import prebuilt

ledger_c = tool_call_ledger.c
log_c = tool_execution_log.c


def _insert(conn: Connection, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
    """The dialect's INSERT, which has ON CONFLICT."""
    return (postgresql.insert if conn.dialect == "postgresql" else sqlite.insert)(table)


# --- the ledger: compare-and-set ---------------------------------------------


def claim_first(conn: Connection, key: CallKey, tool_name: str) -> bool:
    """The first attempt's claim: a STARTED row, unless the call has one
    (INSERT ... ON CONFLICT DO NOTHING, built once: Connection.insert_new)."""
    return conn.insert_new(tool_call_ledger, {
        "workflow_id": key.workflow_id, "execution_chain": key.chain,
        "tool_call_id": key.call_id, "tool_name": tool_name,
        "status": LedgerStatus.STARTED.value, "started_at": now_iso()})


def claim_again(conn: Connection, key: CallKey, seen: LedgerRow) -> bool:
    """A later attempt's claim: only while the row is still as `seen`."""
    stmt = sa.update(tool_call_ledger).where(
        key.of(tool_call_ledger), ledger_c.status == seen.status.value,
        ledger_c.attempts == seen.attempts,
    ).values(status=LedgerStatus.STARTED.value, attempts=ledger_c.attempts + 1,
             started_at=now_iso())
    return conn.execute(stmt).rowcount == 1


# The statements of every tool call's end, built once with their values bound
# at execution (building an UPDATE cost several times running it,
# bench/micro.py journal). Keys: wf, chain, call (the call), claim.
_OF_CALL = sa.and_(ledger_c.workflow_id == sa.bindparam("wf"),
                   ledger_c.execution_chain == sa.bindparam("chain"),
                   ledger_c.tool_call_id == sa.bindparam("call"))
_COMPLETE = prebuilt(sa.update(tool_call_ledger).where(
    _OF_CALL, ledger_c.status == LedgerStatus.STARTED.value,
    ledger_c.attempts == sa.bindparam("claim"),
).values(status=LedgerStatus.COMPLETED.value, result=sa.bindparam("v_result"),
         is_error=sa.bindparam("v_is_error"), outcome=sa.bindparam("v_outcome"),
         state=sa.bindparam("v_state"), finished_at=sa.bindparam("v_finished_at")))


def complete(conn: Connection, key: CallKey, claim: int, *, outcome: CallStatus, result: str,
             is_error: bool, state: dict[str, Any] | None) -> bool:
    """The claimed call ended with a result; False when `claim` no longer holds."""
    return conn.changed(_COMPLETE, {
        "wf": key.workflow_id, "chain": key.chain, "call": key.call_id, "claim": claim,
        "v_result": result, "v_is_error": int(is_error), "v_outcome": outcome.value,
        "v_state": json.dumps(state) if state else None, "v_finished_at": now_iso(),
    }) == 1


def release(conn: Connection, key: CallKey, claim: int, error: str) -> None:
    """The claimed attempt ended without a result: a retry may claim it again."""
    conn.execute(sa.update(tool_call_ledger).where(
        key.of(tool_call_ledger), ledger_c.status == LedgerStatus.STARTED.value,
        ledger_c.attempts == claim,
    ).values(status=LedgerStatus.ATTEMPT_FAILED.value, result=error, finished_at=now_iso()))


# --- the audit log -----------------------------------------------------------


@dataclass(frozen=True)
class Execution:
    """Who asked for which call: the columns of an audit row that never change."""

    execution_id: str
    workflow_id: str
    chain: str
    conversation_id: str
    user_id: str
    tool_name: str
    arguments: Any
    # Why the call waited for a reviewer: a condition's words (`@tool(approval=...)`).
    approval_reason: str | None = None
    # Where the sensitive arguments' values came from (revision 7).
    provenance: Provenance | None = None

    def values(self, status: AuditStatus, start: str) -> dict[str, Any]:
        values = {"execution_id": self.execution_id, "workflow_id": self.workflow_id,
                  "conversation_id": self.conversation_id, "user_id": self.user_id,
                  "tool_name": self.tool_name, "input_params": masked_params(self.arguments),
                  "execution_chain": self.chain or None, "status": status.value,
                  "start_time": start}
        if self.approval_reason is not None:  # else the column stays NULL (the usual row)
            values["approval_reason"] = mask(self.approval_reason)
        if self.provenance is not None:  # a tool with sensitive arguments (else NULL)
            values["provenance"] = provenance_text(self.provenance)
        return values


def audit_opened(conn: Connection, execution_id: str) -> AuditStatus | None:
    return conn.scalar(sa.select(log_c.status).where(log_c.execution_id == execution_id),
                       AuditStatus)


# The audit row's upserts, built once per engine with their values bound at
# execution: `excluded` builds an alias of the table, a Column per column,
# and the statement was ~0.4 ms of Python per tool call.
_AUDIT_UPSERTS: dict[tuple[str, bool], Any] = {}


def _audit_upsert(conn: Connection, ended: bool) -> Any:
    """INSERT the row, or on its execution id taken set its start and status,
    and its end and error: from the values when `ended`, else NULL."""
    stmt = _AUDIT_UPSERTS.get((conn.dialect, ended))
    if stmt is None:
        insert = _insert(conn, tool_execution_log)
        new = insert.excluded
        stmt = insert.on_conflict_do_update(
            index_elements=[log_c.execution_id],
            set_={"start_time": new.start_time, "status": new.status,
                  "end_time": new.end_time if ended else None,
                  "error_message": new.error_message if ended else None})
        _AUDIT_UPSERTS[(conn.dialect, ended)] = prebuilt(stmt)
    return stmt


def open_audit(conn: Connection, run: Execution) -> None:
    """The attempt runs the tool: the row says INITIATED (a retry's, again)."""
    conn.changed(_audit_upsert(conn, ended=False),
                 run.values(AuditStatus.INITIATED, now_iso()))


_CLOSE_AUDIT = prebuilt(
    sa.update(tool_execution_log).where(log_c.execution_id == sa.bindparam("id"))
    .values(status=sa.bindparam("v_status"), end_time=sa.bindparam("v_end"),
            error_message=sa.bindparam("v_error")))


def close_audit(conn: Connection, execution_id: str, status: AuditStatus,
                error: str | None) -> bool:
    """The row's end; False when there is no row to end (nothing was written)."""
    done = conn.changed(_CLOSE_AUDIT, {"id": execution_id, "v_status": status.value,
                                       "v_end": now_iso(),
                                       "v_error": mask(error) if error else None})
    return bool(done)


def close_open_audit(conn: Connection, execution_id: str, error: str) -> None:
    """A row an ended attempt left INITIATED: FAILED, with why."""
    conn.execute(sa.update(tool_execution_log).where(
        log_c.execution_id == execution_id, log_c.status == AuditStatus.INITIATED.value,
    ).values(status=AuditStatus.FAILED.value, end_time=now_iso(), error_message=error))


def settle_audit(conn: Connection, run: Execution, status: AuditStatus, error: str) -> None:
    """A call settled without running (or settled again by a retry): one
    complete row."""
    now = now_iso()
    conn.changed(_audit_upsert(conn, ended=True), {
        **run.values(status, now), "end_time": now, "error_message": mask(error) or None})


def add_audit(conn: Connection, run: Execution, status: AuditStatus, error: str) -> None:
    """A complete row of its own, unless the execution has one."""
    now = now_iso()
    stmt = _insert(conn, tool_execution_log).values(
        {**run.values(status, now), "end_time": now, "error_message": error})
    conn.execute(stmt.on_conflict_do_nothing(index_elements=[log_c.execution_id]))


# --- approval decisions ------------------------------------------------------


def record_decision(conn: Connection, key: CallKey, tool_name: str,
                    d: ApprovalDecision) -> None:
    """Who decided what about the call, and when, with the reviewer's edited
    arguments (masked) for an approval with edits (the first record stands)."""
    edited = masked_params(d.arguments) if d.approved and d.arguments is not None else None
    conn.execute(_insert(conn, approval_decision).values(
        workflow_id=key.workflow_id, execution_chain=key.chain, tool_call_id=key.call_id,
        tool_name=tool_name, approved=int(d.approved), reviewer=d.reviewer, note=d.note,
        decided_at=d.decided_at, edited_arguments=edited,
    ).on_conflict_do_nothing(index_elements=list(approval_decision.primary_key)))
