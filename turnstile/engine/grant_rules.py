"""Standing approvals (grants): a reviewer's decision about a class of calls
(docs/approvals.md, "Standing approvals (grants)").

A grant approves later calls of one tool whose arguments meet its
constraints, for a scope (a conversation, a user, a service), until a time
and for a number of uses. The operator bounds what a reviewer may grant per
tool (`GrantCeiling` on the Service); a request beyond a ceiling is refused,
never narrowed silently (a value the reviewer leaves out takes the ceiling's).

Pure: the rules here are used by the grant store (claims), the activities
(issue) and the workflow's decision door (reading a `grant` from a payload).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from turnstile.engine import identity
from turnstile.engine.approvals import canonical_json, recipient_domain
from turnstile.engine.grant_models import (
    Between,
    Constraint,
    Equals,
    Grant,
    GrantCeiling,
    GrantOffer,
    GrantRequest,
    GrantScope,
    OneOf,
)

__all__ = ["GrantRefused", "constraint_miss", "default_constraints", "offer", "read_request",
           "settle_request", "why_not"]

class GrantRefused(ValueError):
    """A grant request the rules refuse (the reason is the message)."""


def read_request(value: Any) -> GrantRequest | str:
    """A decision payload's `grant`, or why it is none."""
    if not isinstance(value, dict):
        return "grant must be a JSON object (scope, until, uses, constraints, covers_untrusted)"
    try:
        return GrantRequest.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "grant"
        return f"grant.{where}: {first['msg']}"[:300]


def default_constraints(arguments: Mapping[str, Any], fields: Collection[str]) -> dict[
        str, Constraint]:
    """Equality on each of `fields` the call has."""
    return {f: Equals(value=arguments[f]) for f in fields if f in arguments}


def offer(ceiling: GrantCeiling, arguments: Mapping[str, Any],
          review_fields: Collection[str]) -> GrantOffer | None:
    if not ceiling.allowed:
        return None
    fields = list(dict.fromkeys([*ceiling.fixed_fields, *review_fields]))
    return GrantOffer(ceiling=ceiling, constraints=default_constraints(arguments, fields))


def settle_request(req: GrantRequest, ceiling: GrantCeiling, *, tool: str,
                   arguments: Mapping[str, Any], review_fields: Collection[str],
                   now: datetime) -> tuple[datetime, int, dict[str, Constraint]]:
    """(until, uses, constraints) of a grant `req` may have, the ceiling's
    values for what it leaves out; GrantRefused beyond the ceiling, or when
    the grant would not cover the call it is issued with."""
    if not ceiling.allowed:
        raise GrantRefused(f"{tool} never takes grants (the operator's ceiling)")
    if req.scope not in ceiling.scopes:
        raise GrantRefused(f"scope {req.scope.value!r} is not allowed for {tool} (allowed: "
                           f"{', '.join(s.value for s in ceiling.scopes) or 'none'})")
    longest = now + timedelta(seconds=ceiling.max_seconds)
    until = req.until if req.until is not None else longest
    if until.tzinfo is None:
        until = until.replace(tzinfo=now.tzinfo)
    if until <= now:
        raise GrantRefused(f"until {until.isoformat()} is not in the future")
    if until > longest + timedelta(seconds=1):
        raise GrantRefused(f"until {until.isoformat()} is beyond {tool}'s ceiling of "
                           f"{ceiling.max_seconds:g} s (at most {longest.isoformat()})")
    uses = req.uses if req.uses is not None else ceiling.max_uses
    if uses > ceiling.max_uses:
        raise GrantRefused(f"{uses} uses is beyond {tool}'s ceiling of {ceiling.max_uses}")
    if req.covers_untrusted and not ceiling.allow_untrusted:
        raise GrantRefused(f"{tool}'s ceiling does not let a grant cover arguments from "
                           "untrusted content (covers_untrusted)")
    constraints = (req.constraints if req.constraints is not None else default_constraints(
        arguments, list(dict.fromkeys([*ceiling.fixed_fields, *review_fields]))))
    for field in ceiling.fixed_fields:
        c = constraints.get(field)
        if field in arguments and not (isinstance(c, Equals) and canonical_json(c.value)
                                       == canonical_json(arguments[field])):
            raise GrantRefused(f"{field} must stay fixed for {tool}: the grant must hold it "
                               f"equal to this call's value")
    miss = constraint_miss(constraints, arguments)
    if miss is not None:
        raise GrantRefused(f"the grant would not cover the call it is issued with: {miss}")
    return until, uses, constraints


def constraint_miss(constraints: Mapping[str, Constraint],
                    arguments: Mapping[str, Any]) -> str | None:
    """Which constraint `arguments` break (None: they meet every one)."""
    for field, c in constraints.items():
        if field not in arguments:
            return f"{field} is missing"
        got = arguments[field]
        if isinstance(c, Equals):
            if canonical_json(got) != canonical_json(c.value):
                return f"{field} is not the granted value"
        elif isinstance(c, OneOf):
            if canonical_json(got) not in {canonical_json(v) for v in c.values}:
                return f"{field} is not one of the granted values"
        elif isinstance(c, Between):
            if isinstance(got, bool) or not isinstance(got, int | float):
                return f"{field} is not a number"
            if (c.min is not None and got < c.min) or (c.max is not None and got > c.max):
                return f"{field} is outside the granted bounds"
        else:
            addresses = got if isinstance(got, list) else [got]
            allowed = {d.lower().lstrip("@").rstrip(".") for d in c.domains}
            if not addresses or any(not isinstance(a, str) or recipient_domain(a) not in allowed
                                    for a in addresses):
                return f"{field} has a recipient outside the granted domains"
    return None


def why_not(grant: Grant, *, service: str, tool_name: str, conversation_id: str, user_id: str,
            arguments: Mapping[str, Any], untrusted: Collection[str], now: datetime) -> str | None:
    """Why `grant` does not cover this call (None: it does, uses permitting)."""
    if grant.revoked_at is not None:
        return f"revoked by {grant.revoked_by} at {grant.revoked_at}"
    if grant.tool_name != tool_name or grant.service != service:
        return "another tool or service"
    key = {GrantScope.CONVERSATION: conversation_id, GrantScope.USER: user_id,
           GrantScope.SERVICE: service}[grant.scope]
    if grant.scope is GrantScope.USER:
        in_scope = identity.same_person(grant.scope_key, key)
    else:
        in_scope = grant.scope_key == key
    if not in_scope:
        return f"out of its {grant.scope.value} scope"
    if identity.same_person(grant.issued_by, user_id):
        return "issued by the user who asks (no self-grants)"
    if datetime.fromisoformat(grant.until) <= now:
        return f"expired at {grant.until}"
    if grant.uses_left <= 0:
        return f"all {grant.max_uses} uses taken"
    miss = constraint_miss(grant.constraints, arguments)
    if miss is not None:
        return miss
    tainted = sorted(untrusted)  # the call's sensitive arguments that came from untrusted content
    if tainted and not grant.covers_untrusted:
        return f"{', '.join(tainted)} came from untrusted content"
    return None
