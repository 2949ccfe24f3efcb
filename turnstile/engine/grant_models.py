"""The shapes of standing approvals (grants): what a reviewer asks for,
what the operator allows, what is stored and what a pending call shows.
Pure data (imported by turnstile.engine.contract); the rules are in
turnstile.engine.grant_rules."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

# A grant's reason and the texts it carries are cut to this.
GRANT_TEXT_MAX = 500
# A grant names at most this many argument constraints, each set at most this many values.
MAX_CONSTRAINTS = 20
MAX_VALUES = 50
# The reviewer a grant's approval names (`grant:<id>`): no person decided it.
GRANT_REVIEWER_PREFIX = "grant:"


class GrantScope(StrEnum):
    """Whose later calls a grant covers (the key is the issuing turn's)."""

    CONVERSATION = "conversation"
    USER = "user"
    SERVICE = "service"


class Equals(BaseModel):
    """The argument equals this value (compared as canonical JSON)."""

    kind: Literal["equals"] = "equals"
    value: Any


class OneOf(BaseModel):
    """The argument is one of these values."""

    kind: Literal["one_of"] = "one_of"
    values: list[Any] = Field(min_length=1, max_length=MAX_VALUES)


class Between(BaseModel):
    """The argument is a number within these bounds (inclusive; None: open)."""

    kind: Literal["between"] = "between"
    min: float | None = None
    max: float | None = None


class RecipientDomain(BaseModel):
    """Every address of the argument (a string or a list) is at one of these domains."""

    kind: Literal["domain"] = "domain"
    domains: list[str] = Field(min_length=1, max_length=MAX_VALUES)


Constraint = Annotated[Equals | OneOf | Between | RecipientDomain, Field(discriminator="kind")]


class GrantRequest(BaseModel):
    """What a reviewer asks for with an approval (`grant` of the `review`
    update and the `approve` signal). Left-out limits take the tool's
    ceiling; `constraints` None: every field the ceiling fixes plus the
    tool's review fields must equal this call's values."""

    model_config = {"extra": "forbid"}

    scope: GrantScope = GrantScope.CONVERSATION
    until: datetime | None = None  # UTC (a time without a zone is read as UTC)
    uses: int | None = Field(default=None, ge=1)
    constraints: dict[str, Constraint] | None = Field(default=None, max_length=MAX_CONSTRAINTS)
    # Cover calls whose constrained arguments come from untrusted content
    # (tool results, documents) too; by default such a call waits for a reviewer.
    covers_untrusted: bool = False
    reason: str = Field(default="", max_length=GRANT_TEXT_MAX)


class GrantCeiling(BaseModel):
    """The operator's bound on the grants of one tool (`Service.grant_ceilings`;
    `Service.default_grant_ceiling` for tools without one)."""

    allowed: bool = True  # False: the tool never takes grants
    max_seconds: float = 7 * 86400.0  # the longest a grant may last
    max_uses: int = 100  # the most uses a grant may have
    # Arguments a grant must hold equal to the issuing call's (e.g. an e-mail's `to`).
    fixed_fields: list[str] = Field(default_factory=list)
    scopes: list[GrantScope] = Field(default_factory=lambda: list(GrantScope))
    allow_untrusted: bool = False  # may a grant say covers_untrusted?


class Grant(BaseModel):
    """A grant as stored (table `approval_grant`) and shown."""

    grant_id: str
    service: str
    tool_name: str
    scope: GrantScope
    scope_key: str  # the conversation id, the user id, or the service name
    constraints: dict[str, Constraint] = Field(default_factory=dict)
    until: str  # ISO 8601, UTC
    max_uses: int
    uses: int = 0  # claimed so far
    covers_untrusted: bool = False
    issued_by: str
    issued_at: str
    reason: str = ""
    # The call whose approval issued it.
    workflow_id: str = ""
    tool_call_id: str = ""
    requested_by: str = ""  # the user of the turn whose call issued it
    revoked_at: str | None = None
    revoked_by: str | None = None

    @property
    def uses_left(self) -> int:
        return max(0, self.max_uses - self.uses)


class GrantOffer(BaseModel):
    """On a pending call (`PendingApproval.grant_offer`): what a reviewer may
    grant with the approval — the tool's ceiling and the constraints a grant
    takes by default (the review fields and the fixed fields, equal to this
    call's values)."""

    ceiling: GrantCeiling
    constraints: dict[str, Constraint] = Field(default_factory=dict)


class GrantCandidate(BaseModel):
    """A live grant of the call's tool and scope that did not cover it, and why
    (`PendingApproval.grant_candidates`)."""

    grant_id: str
    why_not: str
