"""The rules of standing approvals, pure (turnstile.engine.grant_rules): what
a reviewer may ask for under the operator's ceiling, which constraint a call
breaks, why a grant does not cover a call, and what a decision payload's
`grant` may hold. The same rules through real turns: tests/test_grants.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from turnstile.engine.decision_payloads import DecisionKind, Unreadable, read_decision
from turnstile.engine.grant_models import (
    Between,
    Equals,
    Grant,
    GrantCeiling,
    GrantRequest,
    GrantScope,
    OneOf,
    RecipientDomain,
)
from turnstile.engine.grant_rules import (
    GrantRefused,
    constraint_miss,
    read_request,
    settle_request,
    why_not,
)

NOW = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
MAIL = {"to": "ops@example.com", "subject": "numbers", "body": "hi"}


def settle(req: GrantRequest, ceiling: GrantCeiling | None = None,
           arguments: dict[str, Any] | None = None) -> tuple[datetime, int, dict[str, Any]]:
    return settle_request(req, ceiling or GrantCeiling(), tool="createEmailTask",
                          arguments=arguments or MAIL, review_fields=["to", "subject"], now=NOW)


def test_left_out_limits_take_the_ceiling_and_defaults_hold_the_review_fields() -> None:
    until, uses, constraints = settle(GrantRequest(), GrantCeiling(max_seconds=3600, max_uses=7))
    assert (until, uses) == (NOW + timedelta(hours=1), 7)
    assert constraints == {"to": Equals(value="ops@example.com"),
                           "subject": Equals(value="numbers")}


@pytest.mark.parametrize("req,ceiling,words", [
    (GrantRequest(uses=101), GrantCeiling(), "101 uses is beyond createEmailTask's ceiling of 100"),
    (GrantRequest(until=NOW + timedelta(days=8)), GrantCeiling(), "beyond createEmailTask's"),
    (GrantRequest(until=NOW - timedelta(seconds=1)), GrantCeiling(), "is not in the future"),
    (GrantRequest(), GrantCeiling(allowed=False), "never takes grants"),
    (GrantRequest(scope=GrantScope.SERVICE), GrantCeiling(scopes=[GrantScope.CONVERSATION]),
     "scope 'service' is not allowed"),
    (GrantRequest(covers_untrusted=True), GrantCeiling(), "untrusted content"),
    (GrantRequest(constraints={}), GrantCeiling(fixed_fields=["to"]), "to must stay fixed"),
    (GrantRequest(constraints={"to": Equals(value="x@example.com")}), GrantCeiling(),
     "would not cover the call it is issued with: to is not the granted value"),
])
def test_a_request_beyond_the_ceiling_is_refused(req: GrantRequest, ceiling: GrantCeiling,
                                                 words: str) -> None:
    with pytest.raises(GrantRefused, match=words.replace("(", r"\(").replace(")", r"\)")):
        settle(req, ceiling)


@pytest.mark.parametrize("constraint,value,miss", [
    (Equals(value="ops@example.com"), "ops@example.com", None),
    (Equals(value="ops@example.com"), "OPS@example.com", "is not the granted value"),
    (OneOf(values=["a", "b"]), "b", None),
    (OneOf(values=["a", "b"]), "c", "is not one of"),
    (Between(min=0, max=100), 100, None),
    (Between(max=100), 100.5, "outside the granted bounds"),
    (Between(max=100), "50", "is not a number"),
    (Between(max=100), True, "is not a number"),
    (RecipientDomain(domains=["example.com"]), ["a@example.com", "b@EXAMPLE.com."], None),
    (RecipientDomain(domains=["example.com"]), ["a@example.com", "b@evil.org"], "outside"),
    (RecipientDomain(domains=["example.com"]), [], "outside"),
])
def test_each_kind_of_constraint(constraint: Any, value: Any, miss: str | None) -> None:
    found = constraint_miss({"x": constraint}, {"x": value})
    assert (found is None) if miss is None else (found is not None and miss in found)
    assert constraint_miss({"x": constraint}, {}) == "x is missing"


def grant(**changes: Any) -> Grant:
    base = Grant(grant_id="g-1", service="sales", tool_name="createEmailTask",
                 scope=GrantScope.USER, scope_key="alice",
                 constraints={"to": Equals(value="ops@example.com")},
                 until=(NOW + timedelta(hours=1)).isoformat(), max_uses=2, uses=0,
                 issued_by="bob", issued_at=NOW.isoformat())
    return base.model_copy(update=changes)


def covers(g: Grant, user: str = "alice", untrusted: tuple[str, ...] = (),
           arguments: dict[str, Any] | None = None) -> str | None:
    return why_not(g, service="sales", tool_name="createEmailTask", conversation_id="c-1",
                   user_id=user, arguments=arguments or MAIL, untrusted=untrusted, now=NOW)


def test_why_a_grant_does_not_cover_a_call() -> None:
    assert covers(grant()) is None
    assert covers(grant(), user="ALİCE") is None  # the same person, as identities compare
    assert covers(grant(), user="carol") == "out of its user scope"
    assert covers(grant(scope=GrantScope.SERVICE, scope_key="sales"), user="Bob") == (
        "issued by the user who asks (no self-grants)")
    assert covers(grant(uses=2)) == "all 2 uses taken"
    assert covers(grant(until=NOW.isoformat())).startswith("expired")
    assert covers(grant(revoked_at=NOW.isoformat(), revoked_by="carol")).startswith("revoked")
    assert covers(grant(), arguments={**MAIL, "to": "x@example.com"}) == (
        "to is not the granted value")
    assert covers(grant(), untrusted=("to",)) == "to came from untrusted content"
    assert covers(grant(covers_untrusted=True), untrusted=("to",)) is None


def test_a_decision_reads_its_grant() -> None:
    read = read_decision(DecisionKind.REVIEW, {
        "tool_call_id": "c1", "reviewer": "bob", "approved": True,
        "grant": {"scope": "user", "uses": 2, "until": "2026-12-07T00:00:00Z",
                  "constraints": {"to": {"kind": "domain", "domains": ["example.com"]}}}})
    assert not isinstance(read, Unreadable) and read.grant is not None
    assert read.grant.constraints == {"to": RecipientDomain(domains=["example.com"])}
    rejected = read_decision(DecisionKind.REVIEW, {"tool_call_id": "c1", "reviewer": "bob",
                                                   "approved": False, "grant": {}})
    assert isinstance(rejected, Unreadable) and "only with an approval" in rejected.reason
    for bad, words in [([], "must be a JSON object"), ({"uses": 0}, "grant.uses"),
                       ({"scope": "world"}, "grant.scope"), ({"usse": 2}, "grant.usse"),
                       ({"constraints": {"to": {"kind": "regex"}}}, "grant.constraints")]:
        problem = read_request(bad)
        assert isinstance(problem, str) and words in problem, (bad, problem)
        signal = read_decision(DecisionKind.APPROVE, {"tool_call_id": "c1", "reviewer": "bob",
                                                      "grant": bad})
        assert isinstance(signal, Unreadable)


values = st.one_of(st.text(max_size=20), st.integers(-10**6, 10**6),
                   st.floats(allow_nan=False, allow_infinity=False, width=32), st.booleans(),
                   st.lists(st.text(max_size=5), max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), values, min_size=1, max_size=5),
       st.data())
def test_a_settled_grant_always_covers_the_call_it_was_issued_with(
        arguments: dict[str, Any], data: st.DataObject) -> None:
    """Whatever the arguments and the fields held equal: the grant settled
    for a call covers that call (and so is never issued broken)."""
    held = data.draw(st.lists(st.sampled_from(sorted(arguments)), unique=True))
    until, uses, constraints = settle_request(
        GrantRequest(constraints={f: Equals(value=arguments[f]) for f in held}),
        GrantCeiling(), tool="t", arguments=arguments, review_fields=[], now=NOW)
    g = grant(tool_name="t", constraints=constraints, until=until.isoformat(), max_uses=uses)
    assert why_not(g, service="sales", tool_name="t", conversation_id="c", user_id="alice",
                   arguments=arguments, untrusted=(), now=NOW) is None
