"""Standing approvals as stored: `approval_grant` (one row per grant: what it
covers, its limits, who issued and who revoked it) and `grant_use` (one row
per call a grant approved, unique per call: workflow id, execution chain,
tool call id). This module is the one writer of both
(tests/test_one_writer.py); the rules are turnstile.engine.grant_rules.

A use is claimed exactly once: `claim` runs in one transaction — the call's
use if it has one (a retried, reset or crashed turn asking again gets the
same answer and counts nothing), else the first live grant that covers the
call, whose count is raised only while uses are left and it is not revoked
(a compare-and-set UPDATE), with the call's `grant_use` row.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from pydantic import TypeAdapter

from turnstile.engine.grant_models import Constraint, Grant, GrantCandidate, GrantScope
from turnstile.engine.grant_rules import why_not
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.tables import metadata, stored_time, text_columns

approval_grant = sa.Table(
    "approval_grant", metadata,
    sa.Column("grant_id", sa.Text, primary_key=True),
    *text_columns("service", "tool_name", "scope", "scope_key", "constraints", "until"),
    sa.Column("max_uses", sa.Integer, nullable=False),
    sa.Column("uses", sa.Integer, nullable=False, server_default="0"),
    sa.Column("covers_untrusted", sa.Integer, nullable=False, server_default="0"),
    *text_columns("issued_by", "issued_at"),
    *text_columns("reason", "workflow_id", "execution_chain", "tool_call_id", "requested_by",
                  "revoked_at", "revoked_by", "revoke_reason", nullable=True),
    sa.Index("approval_grant_tool", "service", "tool_name"),
)

grant_use = sa.Table(
    "grant_use", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    *text_columns("grant_id", "workflow_id", "execution_chain", "tool_call_id", "tool_name",
                  "conversation_id", "user_id", "used_at"),
    sa.UniqueConstraint("workflow_id", "execution_chain", "tool_call_id",
                        name="grant_use_call"),
    sa.Index("grant_use_grant", "grant_id"),
)

g = approval_grant.c
u = grant_use.c
_CONSTRAINTS: TypeAdapter[dict[str, Constraint]] = TypeAdapter(dict[str, Constraint])


class GrantNotFound(LookupError):
    """No grant has this id."""


@dataclass(frozen=True)
class CallOf:
    """The call a grant is claimed for."""

    workflow_id: str
    chain: str
    tool_call_id: str
    service: str
    tool_name: str
    conversation_id: str
    user_id: str
    arguments: Mapping[str, Any]
    untrusted: Collection[str] = ()


@dataclass(frozen=True)
class Claimed:
    """What `claim` found: the grant that approved the call (None: none did),
    and the live grants of the tool that did not, with why."""

    grant: Grant | None
    candidates: list[GrantCandidate]


def grant_id_for(workflow_id: str, chain: str, tool_call_id: str) -> str:
    """The id of the grant a call's approval issues: the same for every
    attempt of the activity that issues it (so a retry issues nothing twice)."""
    digest = hashlib.sha256(f"{workflow_id}\x00{chain}\x00{tool_call_id}".encode(
        "utf-8", "surrogatepass")).hexdigest()
    return f"g-{digest[:16]}"


def now_utc() -> datetime:
    return datetime.now(UTC)


def _grant(row: Any) -> Grant:
    return Grant(
        grant_id=row["grant_id"], service=row["service"], tool_name=row["tool_name"],
        scope=GrantScope(row["scope"]), scope_key=row["scope_key"],
        constraints=_CONSTRAINTS.validate_json(row["constraints"]), until=row["until"],
        max_uses=int(row["max_uses"]), uses=int(row["uses"]),
        covers_untrusted=bool(row["covers_untrusted"]), issued_by=row["issued_by"],
        issued_at=row["issued_at"], reason=row["reason"] or "",
        workflow_id=row["workflow_id"] or "", tool_call_id=row["tool_call_id"] or "",
        requested_by=row["requested_by"] or "", revoked_at=row["revoked_at"],
        revoked_by=row["revoked_by"])


def issue(db: Database, grant: Grant, chain: str) -> Grant:
    """Store `grant` (its id is the issuing call's: `grant_id_for`); a grant
    already stored under the id stands and is returned as stored."""
    values = {
        "grant_id": grant.grant_id, "service": grant.service, "tool_name": grant.tool_name,
        "scope": grant.scope.value, "scope_key": grant.scope_key,
        "constraints": json.dumps(_CONSTRAINTS.dump_python(grant.constraints, mode="json"),
                                  sort_keys=True),
        "until": grant.until, "max_uses": grant.max_uses, "uses": 0,
        "covers_untrusted": int(grant.covers_untrusted), "issued_by": grant.issued_by,
        "issued_at": grant.issued_at, "reason": grant.reason or None,
        "workflow_id": grant.workflow_id or None, "execution_chain": chain or None,
        "tool_call_id": grant.tool_call_id or None, "requested_by": grant.requested_by or None}
    with db.connect() as conn:
        conn.insert_new(approval_grant, values)
        return _read(conn, grant.grant_id)


def _read(conn: Connection, grant_id: str) -> Grant:
    row = conn.execute(sa.select(approval_grant).where(g.grant_id == grant_id)).mappings().first()
    if row is None:
        raise GrantNotFound(f"no grant {grant_id!r}")
    return _grant(row)


def get(db: Database, grant_id: str) -> Grant:
    with db.connect() as conn:
        return _read(conn, grant_id)


def revoke(db: Database, grant_id: str, by: str, reason: str = "") -> Grant:
    """Revoke the grant (the first revocation stands); it covers nothing from
    now, calls already waiting included (every claim checks it again)."""
    with db.connect() as conn:
        _read(conn, grant_id)
        conn.execute(sa.update(approval_grant).where(
            g.grant_id == grant_id, g.revoked_at.is_(None)).values(
            revoked_at=stored_time(now_utc()), revoked_by=by, revoke_reason=reason or None))
        return _read(conn, grant_id)


def listed(db: Database, *, include_ended: bool = False, service: str | None = None,
           tool_name: str | None = None, limit: int = 200) -> list[Grant]:
    """Grants, newest first: live ones (not revoked, not expired, uses left)
    unless `include_ended`."""
    where: list[sa.ColumnElement[bool]] = []
    if service:
        where.append(g.service == service)
    if tool_name:
        where.append(g.tool_name == tool_name)
    if not include_ended:
        where += [g.revoked_at.is_(None), g.until > stored_time(now_utc()),
                  g.uses < g.max_uses]
    with db.connect() as conn:
        rows = conn.execute(sa.select(approval_grant).where(*where)
                            .order_by(g.issued_at.desc(), g.grant_id).limit(limit)).mappings()
        return [_grant(r) for r in rows]


def claim(db: Database, call: CallOf, max_candidates: int = 5) -> Claimed:
    """The grant that approves `call`, its use recorded (see the module's doc)."""
    now = now_utc()
    with db.connect() as conn:
        used = conn.execute(sa.select(u.grant_id).where(
            u.workflow_id == call.workflow_id, u.execution_chain == call.chain,
            u.tool_call_id == call.tool_call_id)).scalar()
        if used is not None:  # claimed before: the same answer, counted once
            return Claimed(_read(conn, str(used)), [])
        rows = conn.execute(sa.select(approval_grant).where(
            g.service == call.service, g.tool_name == call.tool_name,
            g.revoked_at.is_(None), g.until > stored_time(now),
            # In scope (a user's grants are compared as identities, below).
            sa.or_(g.scope == GrantScope.USER.value,
                   sa.and_(g.scope == GrantScope.CONVERSATION.value,
                           g.scope_key == call.conversation_id),
                   sa.and_(g.scope == GrantScope.SERVICE.value, g.scope_key == call.service)),
        ).order_by(g.issued_at, g.grant_id)).mappings().all()
        candidates: list[GrantCandidate] = []
        for row in rows:
            grant = _grant(row)
            problem = why_not(grant, service=call.service, tool_name=call.tool_name,
                              conversation_id=call.conversation_id, user_id=call.user_id,
                              arguments=call.arguments, untrusted=call.untrusted, now=now)
            if problem is None and _take_use(conn, grant.grant_id):
                conn.execute(sa.insert(grant_use).values(
                    grant_id=grant.grant_id, workflow_id=call.workflow_id,
                    execution_chain=call.chain, tool_call_id=call.tool_call_id,
                    tool_name=call.tool_name, conversation_id=call.conversation_id,
                    user_id=call.user_id, used_at=stored_time(now)))
                return Claimed(_read(conn, grant.grant_id), [])
            if problem is not None and not problem.startswith("out of its") \
                    and len(candidates) < max_candidates:
                candidates.append(GrantCandidate(grant_id=grant.grant_id, why_not=problem))
        return Claimed(None, candidates)


def _take_use(conn: Connection, grant_id: str) -> bool:
    """One use of the grant, only while it has one left and is not revoked."""
    return conn.changed(sa.update(approval_grant).where(
        g.grant_id == grant_id, g.revoked_at.is_(None), g.uses < g.max_uses,
    ).values(uses=g.uses + 1)) == 1


@dataclass(frozen=True)
class UseRow:
    """A `grant_use` row as the truth check reads it."""

    grant_id: str
    workflow_id: str
    execution_chain: str
    tool_call_id: str
    conversation_id: str


def uses(conn: Connection, conversation_id: str | None = None) -> list[UseRow]:
    where = [u.conversation_id == conversation_id] if conversation_id else []
    rows = conn.execute(sa.select(u.grant_id, u.workflow_id, u.execution_chain,
                                  u.tool_call_id, u.conversation_id).where(*where)).mappings()
    return [UseRow(**dict(r)) for r in rows]


def counts(conn: Connection) -> dict[str, int]:
    """Each grant's stored count of uses."""
    rows = conn.execute(sa.select(g.grant_id, g.uses)).mappings()
    return {str(r["grant_id"]): int(r["uses"]) for r in rows}
