"""What became of the tool calls of a run that a reset replaced.

Messages a reset run superseded (turnstile.stores.runs) are kept in
`superseded_message`. Their tool calls may have had effects: the reset run
either makes the same call again — same call id, tool and arguments, so the
same ledger key, and the ledger's stored result is reused instead of the
tool running twice — or it takes another path, and then the effect of the
superseded call remains in the world. When the turn's run ends (its release,
or the next turn's memory load after a terminate), `settle` records, for
each superseded call, which it was: the attribute `turnstile.superseded_effect`
on the call's superseded result (a superseded call without a result gets
one, so the record pairs every call with a result too) and, when an effect
remains or may remain, an audit row `SUPERSEDED` beside the call's own; an
audit row the superseded call left open is closed. Nothing is compensated:
the effect is flagged for a person (and `python starter.py check` prints it).

A reset run's model call that reuses a superseded call id for a *different*
call (another tool or other arguments) gets a fresh id (activities.model,
`prior_calls`), so it never receives the superseded call's result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from turnstile.engine import attributes as attr
from turnstile.engine.contract import AuditStatus, CallStatus
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.stores.audit import execution_id, mask
from turnstile.stores.db import Connection, Database
from turnstile.stores.memory import now_iso


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


@dataclass(frozen=True)
class SupersededMessage:
    """A message a reset run took the slot of, as kept for the record."""

    seq: int
    message: ChatMessage
    workflow_id: str
    chain: str
    run_id: str | None  # the run that wrote it
    superseded_by: str  # the run that took its slot
    superseded_at: str


@dataclass
class SupersededCall:
    """One tool call of superseded messages (the call, its kept results)."""

    conversation_id: str
    workflow_id: str
    chain: str
    call: ToolCall
    seq: int  # the slot of the call's message (or of its result when only that was kept)
    superseded_by: str
    results: list[dict[str, Any]] = field(default_factory=list)  # its superseded result rows

    @property
    def key(self) -> str:
        return execution_id(self.workflow_id, self.call.id, self.chain)

    @property
    def marker(self) -> dict[str, Any] | None:
        for r in self.results:
            found = _attrs(r).get(attr.SUPERSEDED_EFFECT)
            if found:
                return dict(found)
        return None


def _attrs(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row["attributes"]) if row.get("attributes") else {}


def call_identity(name: str, arguments: str) -> str:
    """What makes two calls the same call: the tool and its arguments (as
    JSON values when they parse, so spacing and key order do not count)."""
    try:
        args = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):  # not JSON, or nested too deeply: compared as text
        args = arguments
    return f"{name}\x00{args}"


def superseded_messages(db: Database, conversation_id: str) -> list[SupersededMessage]:
    with db.connect() as conn:
        rows = conn.fetchall("SELECT * FROM superseded_message WHERE conversation_id = :c "
                             "ORDER BY id", {"c": conversation_id})
    out = []
    for r in rows:
        calls = json.loads(r["tool_calls"]) if r["tool_calls"] else []
        msg = ChatMessage(role=r["role"], content=r["content"],
                          tool_calls=[ToolCall.model_validate(c) for c in calls],
                          tool_call_id=r["tool_call_id"], is_error=bool(r["is_error"]),
                          attributes=_attrs(r))
        out.append(SupersededMessage(
            seq=int(r["seq"]), message=msg, workflow_id=r["workflow_id"] or "",
            chain=r["execution_chain"] or "", run_id=r["run_id"],
            superseded_by=r["superseded_by"], superseded_at=r["superseded_at"]))
    return out


def prior_calls(db: Database, conversation_id: str, workflow_id: str,
                chain: str) -> dict[str, str]:
    """Call id -> call identity of every superseded call of the turn."""
    with db.connect() as conn:
        rows = conn.fetchall(
            "SELECT tool_calls FROM superseded_message WHERE conversation_id = :c "
            "AND workflow_id = :wf AND COALESCE(execution_chain, '') = :chain "
            "AND role = 'assistant' AND tool_calls IS NOT NULL ORDER BY id",
            {"c": conversation_id, "wf": workflow_id, "chain": chain})
    return {c["id"]: call_identity(c["name"], c.get("arguments") or "{}")
            for r in rows for c in json.loads(r["tool_calls"])}


def _calls(rows: list[dict[str, Any]]) -> list[SupersededCall]:
    """Group superseded rows into their calls (by turn, chain and call id)."""
    found: dict[tuple[str, str, str], SupersededCall] = {}
    for r in rows:
        wf, chain = r["workflow_id"] or "", r["execution_chain"] or ""
        if r["role"] == "assistant" and r["tool_calls"]:
            for c in json.loads(r["tool_calls"]):
                call = ToolCall.model_validate(c)
                sc = found.setdefault((wf, chain, call.id), SupersededCall(
                    r["conversation_id"], wf, chain, call, int(r["seq"]), r["superseded_by"]))
                sc.call, sc.seq = call, int(r["seq"])  # the call itself, if its result came first
        elif r["role"] == "tool" and r["tool_call_id"]:
            name = str(_attrs(r).get(attr.TOOL_NAME, ""))
            sc = found.setdefault((wf, chain, r["tool_call_id"]), SupersededCall(
                r["conversation_id"], wf, chain, ToolCall(id=r["tool_call_id"], name=name),
                int(r["seq"]), r["superseded_by"]))
            sc.results.append(r)
    return list(found.values())


def effect_of(ledger: dict[str, Any] | None, live: dict[str, Any] | None) -> Effect:
    """`ledger`: the call's ledger row; `live`: the attributes of the result
    memory holds for the call's key now (the reset run's), if any."""
    took = ledger is not None and ledger["status"] == "COMPLETED" and (
        ledger["outcome"] or (CallStatus.FAILED if ledger["is_error"] else CallStatus.COMPLETED)
    ) == CallStatus.COMPLETED.value
    if live is not None:
        claims = (live.get(attr.OUTCOME) == CallStatus.COMPLETED.value
                  or live.get(attr.ROLLED_BACK) or live.get(attr.EFFECT_MAY_REMAIN))
        if claims or not took:
            return Effect.MADE_AGAIN
    if took:
        return Effect.REMAINS
    if ledger is not None and ledger["status"] == "STARTED":
        return Effect.UNKNOWN
    return Effect.NONE


def judge(conn: Connection, sc: SupersededCall) -> tuple[Effect, dict[str, Any] | None]:
    """What became of a superseded call now, and its ledger row."""
    ledger = conn.fetchone(
        "SELECT status, outcome, is_error, result FROM tool_call_ledger WHERE workflow_id = :wf "
        "AND execution_chain = :chain AND tool_call_id = :call",
        {"wf": sc.workflow_id, "chain": sc.chain, "call": sc.call.id})
    live = conn.fetchone(
        "SELECT attributes FROM chat_message WHERE conversation_id = :c AND role = 'tool' "
        "AND tool_call_id = :call AND workflow_id = :wf AND COALESCE(execution_chain, '') = "
        ":chain", {"c": sc.conversation_id, "call": sc.call.id, "wf": sc.workflow_id,
                   "chain": sc.chain})
    return effect_of(ledger, _attrs(live) if live is not None else None), ledger


def all_calls(conn: Connection, conversation_id: str | None = None) -> list[SupersededCall]:
    where, params = ("", {}) if conversation_id is None else (
        " WHERE conversation_id = :c", {"c": conversation_id})
    return _calls(conn.fetchall("SELECT * FROM superseded_message" + where + " ORDER BY id",
                                params))


def settle(conn: Connection, conversation_id: str, by: str, workflow_id: str, chain: str, *,
           mine: bool, audit: bool) -> list[tuple[SupersededCall, Effect]]:
    """Record what became of the superseded calls not settled yet: the turn
    (workflow_id, chain)'s own (`mine`, when its run ends) or every other
    turn's (a memory load holding the lock: their runs have ended). `by`
    names who settles (a run id, or the loading turn)."""
    turn = "(COALESCE(workflow_id, '') = :wf AND COALESCE(execution_chain, '') = :chain)"
    rows = conn.fetchall(
        "SELECT * FROM superseded_message WHERE conversation_id = :c AND settled_at IS NULL "
        f"AND {'' if mine else 'NOT '}{turn} ORDER BY id",
        {"c": conversation_id, "wf": workflow_id, "chain": chain})
    if not rows:
        return []
    settled = []
    for sc in _calls(rows):
        effect, ledger = judge(conn, sc)
        marker = {"by": by, "effect": effect.value,
                  "ledger": ledger["status"] if ledger else None, "detail": DETAIL[effect]}
        _mark(conn, sc, effect, marker, ledger)
        if audit:
            _audit(conn, sc, effect, by)
        settled.append((sc, effect))
    conn.execute(f"UPDATE superseded_message SET settled_at = :now WHERE id IN "
                 f"({', '.join(str(int(r['id'])) for r in rows)})", {"now": now_iso()})
    return settled


def _mark(conn: Connection, sc: SupersededCall, effect: Effect, marker: dict[str, Any],
          ledger: dict[str, Any] | None) -> None:
    """The marker on every kept result of the call; a call kept without a
    result gets one (the ledger's, when it finished)."""
    for r in sc.results:
        attrs = {**_attrs(r), attr.SUPERSEDED_EFFECT: marker}
        conn.execute("UPDATE superseded_message SET attributes = :a WHERE id = :id",
                     {"a": json.dumps(attrs), "id": r["id"]})
    if sc.results:
        return
    if ledger is not None and ledger["status"] == "COMPLETED":
        text, is_error = ledger["result"] or "", bool(ledger["is_error"])
    else:
        is_error = True
        text = (f"No result: the run that made this call to {sc.call.name} was replaced by a "
                f"reset (run {sc.superseded_by}): {DETAIL[effect]}.")
    attrs = {attr.TOOL_NAME: sc.call.name, attr.WORKFLOW_ID: sc.workflow_id,
             attr.OUTCOME: (ledger["outcome"] if ledger and ledger["outcome"]
                            else CallStatus.INTERRUPTED.value), attr.SUPERSEDED_EFFECT: marker}
    now = now_iso()
    conn.execute(
        "INSERT INTO superseded_message (conversation_id, seq, role, content, tool_call_id, "
        "is_error, attributes, created_at, workflow_id, execution_chain, superseded_by, "
        "superseded_at, settled_at) VALUES (:c, :seq, 'tool', :text, :call, :err, :a, :now, "
        ":wf, :chain, :by, :now, :now)",
        {"c": sc.conversation_id, "seq": sc.seq, "text": text, "call": sc.call.id,
         "err": is_error, "a": json.dumps(attrs), "now": now, "wf": sc.workflow_id,
         "chain": sc.chain or None, "by": sc.superseded_by})


def _audit(conn: Connection, sc: SupersededCall, effect: Effect, by: str) -> None:
    """Close the call's audit row if it was left open; an effect that
    remains (or may) gets a SUPERSEDED row of its own."""
    if effect is Effect.MADE_AGAIN:
        return  # the reset run's execution wrote the call's audit row
    now = now_iso()
    conn.execute("UPDATE tool_execution_log SET status = :s, end_time = :now, "
                 "error_message = :e WHERE execution_id = :k AND status = :open",
                 {"s": AuditStatus.FAILED.value, "now": now, "k": sc.key,
                  "open": AuditStatus.INITIATED.value,
                  "e": f"superseded by reset run {sc.superseded_by}: {DETAIL[effect]}"})
    if effect is Effect.NONE:
        return
    user = conn.fetchone("SELECT user_id FROM conversation WHERE conversation_id = :c",
                         {"c": sc.conversation_id})
    conn.execute(
        "INSERT INTO tool_execution_log (execution_id, workflow_id, conversation_id, user_id, "
        "tool_name, input_params, start_time, end_time, status, error_message, "
        "execution_chain) VALUES (:k, :wf, :c, :u, :t, :p, :now, :now, :s, :e, :chain) "
        "ON CONFLICT (execution_id) DO NOTHING",
        {"k": f"{sc.key}/superseded", "wf": sc.workflow_id, "c": sc.conversation_id,
         "u": user["user_id"] if user else "", "t": sc.call.name or "(unknown)",
         "p": mask(sc.call.arguments)[:16_384], "now": now, "s": AuditStatus.SUPERSEDED.value,
         "e": f"{DETAIL[effect]} (turn {sc.workflow_id} was reset; run "
              f"{sc.superseded_by} took its place; recorded by {by})",
         "chain": sc.chain or None})
