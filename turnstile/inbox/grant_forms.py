"""The inbox's standing approvals (docs/inbox.md, docs/approvals.md): the
grant part of a call's approval form, read into a `GrantRequest`, and the
rows of the `/grants` page (masked as `starter.py grants list` shows them)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from turnstile.cli.grants import shown
from turnstile.engine.grant_models import Constraint, Equals, GrantOffer, GrantRequest, GrantScope

__all__ = ["GrantFormProblem", "grant_request", "offered_fields", "page_rows"]


class GrantFormProblem(ValueError):
    """The grant part of the form cannot be read (said on the page)."""


def offered_fields(offer: GrantOffer | None) -> list[dict[str, Any]]:
    """The fields the form offers to hold equal: name, whether the ceiling
    fixes it (always held), and whether it is held by default."""
    if offer is None:
        return []
    fixed = set(offer.ceiling.fixed_fields)
    return [{"name": name, "fixed": name in fixed} for name in offer.constraints]


def _number(form: Mapping[str, str], key: str, what: str) -> float | None:
    text = form.get(key, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise GrantFormProblem(f"{what} must be a number, not {text[:40]!r}") from None
    if value <= 0:
        raise GrantFormProblem(f"{what} must be more than 0")
    return value


def grant_request(form: Mapping[str, str], offer: GrantOffer | None,
                  arguments: Mapping[str, Any], now: datetime | None = None
                  ) -> GrantRequest | None:
    """The grant the approval form asks for (None: the box is not ticked).
    The fields held equal take the values the call runs with (`arguments`:
    the reviewer's edits, if any, else the model's)."""
    if form.get("grant") != "on":
        return None
    if offer is None:
        raise GrantFormProblem("this tool takes no standing approvals")
    uses = _number(form, "grant_uses", "uses")
    hours = _number(form, "grant_hours", "hours")
    fixed = set(offer.ceiling.fixed_fields)
    constraints: dict[str, Constraint] = {
        name: Equals(value=arguments[name]) for name in offer.constraints
        if name in arguments and (name in fixed or form.get(f"grant_keep.{name}") == "on")}
    moment = now or datetime.now(UTC)
    try:
        return GrantRequest(
            scope=GrantScope(form.get("grant_scope", GrantScope.CONVERSATION.value)),
            uses=int(uses) if uses is not None else None,
            until=moment + timedelta(hours=hours) if hours is not None else None,
            constraints=constraints, reason=form.get("grant_reason", "")[:500])
    except (ValidationError, ValueError) as exc:
        raise GrantFormProblem(f"the grant cannot be read: {str(exc).splitlines()[0]}") from None


def page_rows(grants: list[Any]) -> list[dict[str, Any]]:
    return [shown(g) for g in grants]
