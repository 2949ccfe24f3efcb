"""What became of the tool calls of a run that a reset replaced.

Messages a reset run superseded (turnstile.stores.runs) are kept in
`superseded_message` (`keep`; this module declares that table and is its one
writer). Their tool calls may have had effects: the reset run
either makes the same call again — same call id, tool and arguments, so the
same ledger key, and the ledger's stored result is reused instead of the
tool running twice — or it takes another path, and then the effect of the
superseded call remains in the world. When the turn's run ends (its release,
or the next turn's memory load after a terminate), `settle` records, for
each superseded call, which it was: the attribute `turnstile.superseded_effect`
on the call's superseded result (a superseded call without a result gets
one, so the record pairs every call with a result too) and, when an effect
remains or may remain, an audit row `SUPERSEDED` beside the call's own; an
audit row the superseded call left open is closed (those audit writes are the
call journal's: `CallJournal.settle_own_superseded` and
`settle_others_superseded` call `settle`). Nothing is compensated:
the effect is flagged for a person (and `python starter.py check` prints it).

A reset run's model call that reuses a superseded call id for a *different*
call (another tool or other arguments) gets a fresh id (activities.model,
`prior_calls`), so it never receives the superseded call's result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

import sqlalchemy as sa

from turnstile.engine import attributes as attr
from turnstile.engine.contract import CallStatus
from turnstile.engine.messages import ChatMessage, Role, ToolCall
from turnstile.stores import ledger as ledger_store
from turnstile.stores.call_key import CallKey, execution_id
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.ledger import LedgerRow, LedgerStatus
from turnstile.stores.memory import (
    MessageRow,
    chat_message,
    load_attributes,
    message_columns,
    now_iso,
)
from turnstile.stores.prebuilt import prebuilt
from turnstile.stores.tables import metadata, text_columns

superseded_message = sa.Table(
    "superseded_message", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("conversation_id", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),  # the slot it had in chat_message
    *message_columns(),
    sa.Column("parts", sa.Text),  # its chat_message_part rows, as a JSON list
    # created_at, and the turn and run that wrote it
    *text_columns("created_at", "workflow_id", "execution_chain", "run_id", nullable=True),
    sa.Column("superseded_by", sa.Text, nullable=False),  # the run that took its slot
    sa.Column("superseded_at", sa.Text, nullable=False),
    # When what became of its tool calls was recorded (turnstile.stores.superseded).
    sa.Column("settled_at", sa.Text),
    sa.Index("superseded_message_conversation", "conversation_id", "seq"),
)
t = superseded_message.c


class Effect(StrEnum):
    """`turnstile.superseded_effect.effect`."""

    MADE_AGAIN = "made_again"  # the reset run made the same call; memory has its result
    REMAINS = "remains"  # it took effect; the reset run did not make it again
    UNKNOWN = "unknown"  # it was running when its run was replaced: may remain
    NONE = "none"  # it never took effect


DETAIL = {
    Effect.MADE_AGAIN: "the reset run made this call again; its result in memory is the call's",
    Effect.REMAINS: "effect of a superseded call remains: the reset run did not make this call "
                    "again",
    Effect.UNKNOWN: "the call was running when its run was superseded; its effect may remain",
    Effect.NONE: "the call never took effect",
}


def _json(text: str | None) -> Any:
    return json.loads(text) if text else None


@dataclass(frozen=True)
class SupersededRow:
    """A message a reset run took the slot of, as kept for the record
    (one row of `superseded_message`)."""

    id: int
    conversation_id: str
    seq: int
    message: ChatMessage
    workflow_id: str
    chain: str
    run_id: str | None  # the run that wrote it
    superseded_by: str  # the run that took its slot
    superseded_at: str

    @classmethod
    def read(cls, r: _Stored) -> SupersededRow:
        msg = ChatMessage(role=r.role, content=r.content,
                          tool_calls=[ToolCall.model_validate(c)
                                      for c in _json(r.tool_calls) or []],
                          tool_call_id=r.tool_call_id, is_error=bool(r.is_error),
                          attributes=load_attributes(r.attributes))
        return cls(id=int(r.id), conversation_id=r.conversation_id, seq=int(r.seq),
                   message=msg, workflow_id=r.workflow_id or "",
                   chain=r.execution_chain or "", run_id=r.run_id,
                   superseded_by=r.superseded_by, superseded_at=r.superseded_at)


class _Stored(NamedTuple):
    """A `superseded_message` row as stored (`sa.select(superseded_message)`)."""

    id: int
    conversation_id: str
    seq: int
    role: Role
    content: str | None
    tool_calls: str | None
    tool_call_id: str | None
    is_error: int
    attributes: str | None
    parts: str | None
    created_at: str | None
    workflow_id: str | None
    execution_chain: str | None
    run_id: str | None
    superseded_by: str
    superseded_at: str
    settled_at: str | None


def keep(conn: Connection, row: MessageRow, parts: list[dict[str, Any]], by: str,
         now: str) -> None:
    """Keep a memory row that run `by` supersedes (turnstile.stores.runs
    removes it from memory), with its images (`parts`). Only tool calls and
    results have effects to look at: other rows are kept settled."""
    open_ = row.role == "tool" or (row.role == "assistant" and bool(row.tool_calls)
                                   and not load_attributes(row.attributes).get(attr.DISCARDED))
    conn.execute(sa.insert(superseded_message).values(
        {**row._asdict(), "is_error": bool(row.is_error),
         "parts": json.dumps(parts) if parts else None, "superseded_by": by,
         "superseded_at": now, "settled_at": None if open_ else now}))


@dataclass
class SupersededCall:
    """One tool call of superseded messages (the call, its kept results)."""

    conversation_id: str
    workflow_id: str
    chain: str
    call: ToolCall
    seq: int  # the slot of the call's message (or of its result when only that was kept)
    superseded_by: str
    results: list[SupersededRow] = field(default_factory=list)  # its superseded results

    @property
    def key(self) -> str:
        return execution_id(self.workflow_id, self.call.id, self.chain)

    @property
    def marker(self) -> dict[str, Any] | None:
        for r in self.results:
            found = r.message.attributes.get(attr.SUPERSEDED_EFFECT)
            if found:
                return dict(found)
        return None


def call_identity(name: str, arguments: str) -> str:
    """What makes two calls the same call: the tool and its arguments (as
    JSON values when they parse, so spacing and key order do not count)."""
    try:
        args = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):  # not JSON, or nested too deeply: compared as text
        args = arguments
    return f"{name}\x00{args}"


def _rows(conn: Connection, *where: sa.ColumnElement[bool]) -> list[SupersededRow]:
    return _read(conn, sa.select(superseded_message).where(*where).order_by(t.id))


def _read(conn: Connection, stmt: sa.Select[Any],
          params: dict[str, str] | None = None) -> list[SupersededRow]:
    return [SupersededRow.read(r) for r in conn.rows(stmt, _Stored, params)]


def superseded_messages(db: Database, conversation_id: str) -> list[SupersededRow]:
    with db.connect() as conn:
        return _rows(conn, t.conversation_id == conversation_id)


# Built once: every model call that asks for tools reads it (values bound).
_PRIOR_CALLS = prebuilt(sa.select(superseded_message).where(
    t.conversation_id == sa.bindparam("conv"),
    sa.func.coalesce(t.workflow_id, "") == sa.bindparam("wf"),
    sa.func.coalesce(t.execution_chain, "") == sa.bindparam("chain"),
    t.role == "assistant", t.tool_calls.is_not(None)).order_by(t.id))


def prior_calls(db: Database, conversation_id: str, workflow_id: str,
                chain: str, conn: Connection | None = None) -> dict[str, str]:
    """Call id -> call identity of every superseded call of the turn (in
    `conn`'s transaction when given)."""
    with db.joined(conn) as conn:
        rows = [SupersededRow.read(r) for r in conn.rows(_PRIOR_CALLS, _Stored, {
            "conv": conversation_id, "wf": workflow_id, "chain": chain})]
    return {c.id: call_identity(c.name, c.arguments or "{}")
            for r in rows for c in r.message.tool_calls}


def _calls(rows: list[SupersededRow]) -> list[SupersededCall]:
    """Group superseded rows into their calls (by turn, chain and call id)."""
    found: dict[tuple[str, str, str], SupersededCall] = {}
    for r in rows:
        m = r.message
        if m.role == "assistant" and m.tool_calls:
            for call in m.tool_calls:
                sc = found.setdefault((r.workflow_id, r.chain, call.id), SupersededCall(
                    r.conversation_id, r.workflow_id, r.chain, call, r.seq, r.superseded_by))
                sc.call, sc.seq = call, r.seq  # the call itself, if its result came first
        elif m.role == "tool" and m.tool_call_id:
            name = str(m.attributes.get(attr.TOOL_NAME, ""))
            sc = found.setdefault((r.workflow_id, r.chain, m.tool_call_id), SupersededCall(
                r.conversation_id, r.workflow_id, r.chain, ToolCall(id=m.tool_call_id, name=name),
                r.seq, r.superseded_by))
            sc.results.append(r)
    return list(found.values())


def effect_of(ledger: LedgerRow | None, live: dict[str, Any] | None) -> Effect:
    """`ledger`: the call's ledger row; `live`: the attributes of the result
    memory holds for the call's key now (the reset run's), if any."""
    took = ledger is not None and ledger.took_effect
    if live is not None:
        claims = (live.get(attr.OUTCOME) == CallStatus.COMPLETED.value
                  or live.get(attr.ROLLED_BACK) or live.get(attr.EFFECT_MAY_REMAIN))
        if claims or not took:
            return Effect.MADE_AGAIN
    if took:
        return Effect.REMAINS
    if ledger is not None and ledger.status is LedgerStatus.STARTED:
        return Effect.UNKNOWN
    return Effect.NONE


class _Attributes(NamedTuple):
    attributes: str | None


def judge(conn: Connection, sc: SupersededCall) -> tuple[Effect, LedgerRow | None]:
    """What became of a superseded call now, and its ledger row."""
    row = ledger_store.read(conn, CallKey(sc.workflow_id, sc.chain, sc.call.id))
    m = chat_message.c
    live = conn.row(sa.select(m.attributes).where(
        m.conversation_id == sc.conversation_id, m.role == "tool", m.tool_call_id == sc.call.id,
        m.workflow_id == sc.workflow_id, sa.func.coalesce(m.execution_chain, "") == sc.chain),
        _Attributes)
    return effect_of(row, None if live is None else load_attributes(live.attributes)), row


def all_calls(conn: Connection, conversation_id: str | None = None) -> list[SupersededCall]:
    where = [] if conversation_id is None else [t.conversation_id == conversation_id]
    return _calls(_rows(conn, *where))


# Built once: every turn reads both (begin_turn the other turns', the release
# its own), the values bound at execution.
_OF_THE_TURN = sa.and_(sa.func.coalesce(t.workflow_id, "") == sa.bindparam("wf"),
                       sa.func.coalesce(t.execution_chain, "") == sa.bindparam("chain"))
_UNSETTLED = sa.select(superseded_message).where(
    t.conversation_id == sa.bindparam("conv"), t.settled_at.is_(None))
_UNSETTLED_OF_TURN = prebuilt(_UNSETTLED.where(_OF_THE_TURN).order_by(t.id))
_UNSETTLED_OF_OTHERS = prebuilt(_UNSETTLED.where(sa.not_(_OF_THE_TURN)).order_by(t.id))


def unsettled_of_turn(conn: Connection, conversation_id: str, workflow_id: str,
                      chain: str) -> list[SupersededRow]:
    """The rows of the turn (workflow_id, chain) not settled yet."""
    return _read(conn, _UNSETTLED_OF_TURN,
                 {"conv": conversation_id, "wf": workflow_id, "chain": chain})


def unsettled_of_other_turns(conn: Connection, conversation_id: str, workflow_id: str,
                             chain: str) -> list[SupersededRow]:
    """The rows of every turn but (workflow_id, chain) not settled yet."""
    return _read(conn, _UNSETTLED_OF_OTHERS,
                 {"conv": conversation_id, "wf": workflow_id, "chain": chain})


def settle(conn: Connection, rows: list[SupersededRow],
           by: str) -> list[tuple[SupersededCall, Effect]]:
    """Record on the superseded rows what became of their calls (the marker,
    a result for a call kept without one) and that they are settled. `by`
    names who settles (a run id, or the loading turn). The call journal
    writes the audit rows of what this returns."""
    settled = []
    for sc in _calls(rows):
        effect, ledger = judge(conn, sc)
        marker = {"by": by, "effect": effect.value,
                  "ledger": ledger.status.value if ledger else None, "detail": DETAIL[effect]}
        _mark(conn, sc, effect, marker, ledger)
        settled.append((sc, effect))
    if rows:
        conn.execute(sa.update(superseded_message).where(t.id.in_([r.id for r in rows]))
                     .values(settled_at=now_iso()))
    return settled


def _mark(conn: Connection, sc: SupersededCall, effect: Effect, marker: dict[str, Any],
          ledger: LedgerRow | None) -> None:
    """The marker on every kept result of the call; a call kept without a
    result gets one (the ledger's, when it finished)."""
    for r in sc.results:
        attrs = {**r.message.attributes, attr.SUPERSEDED_EFFECT: marker}
        conn.execute(sa.update(superseded_message).where(t.id == r.id)
                     .values(attributes=json.dumps(attrs)))
    if sc.results:
        return
    done = ledger if ledger is not None and ledger.status is LedgerStatus.COMPLETED else None
    if done is not None:
        text, is_error = done.result or "", done.is_error
    else:
        is_error = True
        text = (f"No result: the run that made this call to {sc.call.name} was replaced by a "
                f"reset (run {sc.superseded_by}): {DETAIL[effect]}.")
    outcome = ledger.outcome if ledger is not None and ledger.outcome else CallStatus.INTERRUPTED
    attrs = {attr.TOOL_NAME: sc.call.name, attr.WORKFLOW_ID: sc.workflow_id,
             attr.OUTCOME: outcome.value, attr.SUPERSEDED_EFFECT: marker}
    now = now_iso()
    conn.execute(sa.insert(superseded_message).values(
        conversation_id=sc.conversation_id, seq=sc.seq, role="tool", content=text,
        tool_call_id=sc.call.id, is_error=is_error, attributes=json.dumps(attrs),
        created_at=now, workflow_id=sc.workflow_id, execution_chain=sc.chain or None,
        superseded_by=sc.superseded_by, superseded_at=now, settled_at=now))
