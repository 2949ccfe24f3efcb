"""Reads of a conversation's own effects, from its memory (`chat_message`):
the calls of a tool it made (arguments as the model wrote them, with how each
ended), for a reviewer shown the earlier effects that look alike
(activities.review); and whether a call key (`ToolContext.idempotency_key`)
is one of the conversation's calls, for tools that read by an id another of
its calls created (turnstile.sales.sales_tools). Memory, not the audit log: the
log keeps masked arguments and TURNSTILE_AUDIT=off turns it off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from turnstile.engine import attributes as attr
from turnstile.engine.messages import ToolCall
from turnstile.stores.connection import Connection
from turnstile.stores.memory_tables import chat_message, m
from turnstile.stores.tables import stored_time

# At most this many messages of the window are read for one review.
MAX_MESSAGES = 400


@dataclass(frozen=True)
class EarlierCall:
    """One call of the conversation that has its result in memory."""

    call: ToolCall
    outcome: str  # the result's attribute `turnstile.outcome` ("" when absent)
    at: str  # when the result was written
    workflow_id: str
    execution_chain: str


def calls_of(conn: Connection, conversation_id: str, tool_name: str, *, now: datetime,
             window_seconds: float, workflow_id: str = "") -> list[EarlierCall]:
    """The conversation's calls of `tool_name` whose results were written
    within `window_seconds` before `now` (window 0: only those of the turn
    `workflow_id`), newest first. A call is paired with the newest assistant
    message before its result that holds its id (provider ids repeat across turns)."""
    since = stored_time(now - timedelta(seconds=max(0.0, window_seconds)))
    query = (sa.select(m.seq, m.role, m.tool_calls, m.tool_call_id, m.attributes,
                       m.created_at, m.workflow_id, m.execution_chain)
             .where(m.conversation_id == conversation_id, m.role.in_(("assistant", "tool")))
             .order_by(m.seq.desc()).limit(MAX_MESSAGES))
    if window_seconds > 0:
        query = query.where(m.created_at >= since)
    elif workflow_id:
        query = query.where(m.workflow_id == workflow_id)
    rows = list(conn.execute(query))
    rows.reverse()
    found: list[EarlierCall] = []
    asked: dict[str, ToolCall] = {}  # call id -> the newest call with it so far
    for row in rows:
        if row.role == "assistant":
            for call in _calls(row.tool_calls):
                asked[call.id] = call
            continue
        made = asked.get(row.tool_call_id or "")
        if made is None or made.name != tool_name:
            continue
        attributes = _object(row.attributes)
        found.append(EarlierCall(call=made, outcome=str(attributes.get(attr.OUTCOME, "")),
                                 at=row.created_at or "", workflow_id=row.workflow_id or "",
                                 execution_chain=row.execution_chain or ""))
    found.reverse()
    return found


def made_here(conn: Connection, conversation_id: str, idempotency_key: str) -> bool:
    """Is `idempotency_key` (workflow id / execution chain / call id, as
    ToolContext.idempotency_key spells it) a call of this conversation with a
    result in its memory?"""
    chain = sa.func.coalesce(m.execution_chain, "")
    key = sa.case((chain == "", m.workflow_id + "/" + m.tool_call_id),
                  else_=m.workflow_id + "/" + chain + "/" + m.tool_call_id)
    parts = idempotency_key.split("/")
    ids = ["/".join(parts[i:]) for i in range(1, len(parts))]  # the call id is a suffix
    if not ids:
        return False
    found = conn.execute(sa.select(sa.literal(1)).select_from(chat_message).where(
        m.conversation_id == conversation_id, m.tool_call_id.in_(ids), m.role == "tool",
        key == idempotency_key).limit(1)).first()
    return found is not None


def _calls(text: str | None) -> list[ToolCall]:
    try:
        items = json.loads(text) if text else []
    except ValueError:
        return []
    calls = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("id"), str) and isinstance(
                item.get("name"), str):
            arguments = item.get("arguments")
            calls.append(ToolCall(id=item["id"], name=item["name"],
                                  arguments=arguments if isinstance(arguments, str) else "{}"))
    return calls


def _object(text: str | None) -> dict[str, object]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
