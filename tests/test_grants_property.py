"""Property: whatever a run of turns and reviewers does with standing
approvals — grants for a conversation or a user, of one or two uses, for one
recipient or any, issued by a reviewer or (refused) by the user who asks,
revoked between turns — each real turn's mail waits for a person exactly when
no live grant covers it, a covered one is approved by the oldest grant that
covers it and never waits, no turn hangs, and at the end every grant's count
of uses is the number of calls it approved, each with its `grant_use` row and
its audit row (`check` finds no disagreement).

The rule is written plainly in `Model` (docs/approvals.md, "Standing
approvals (grants)"); the sales service's `createEmailTask` under a real dev
server and one worker, on SQLite and PostgreSQL, serves every example; each
example has its own conversations and users. Few examples in CI; set
GRANT_EXAMPLES for more.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support.loop_thread import LoopThread, hosted_worker
from tests.support.temporal_server import DevServer
from tests.support.turns import Turns
from tests.test_grants import audit_grants, mailer, service
from turnstile.client import ApprovalRefused, TurnstileClient
from turnstile.engine.contract import CallStatus, Handlers, PendingApproval, TurnStatus
from turnstile.engine.grant_models import Equals, GrantRequest, GrantScope
from turnstile.providers.function_model import FunctionModel
from turnstile.stores import grant_store, truth
from turnstile.stores.db import Database

EXAMPLES = int(os.environ.get("GRANT_EXAMPLES", "12"))
SALES = "sales-assistant"
ADDRESSES = {"ops": "ops@example.com", "ann": "ann@example.com"}

# Weighted (a repeated choice is drawn more often) so that later turns often
# fall in an earlier grant's scope: the same user, conversation and address.
GRANT = st.tuples(st.just("grant"), st.sampled_from(["conversation", "user"]),
                  st.integers(1, 2), st.booleans(), st.sampled_from(["bob", "bob", "self"]))
DECISION = st.one_of(GRANT, st.just(("approve",)), st.just(("reject",)))
TURN = st.tuples(st.just("turn"), st.sampled_from(["u1", "u1", "u2"]),
                 st.sampled_from(["c1", "c1", "c2"]), st.sampled_from(["ops", "ops", "ann"]),
                 DECISION)
REVOKE = st.tuples(st.just("revoke"), st.integers(0, 3))
STEPS = st.lists(st.one_of(TURN, TURN, TURN, REVOKE), min_size=4, max_size=8)


@dataclass
class Granted:
    grant_id: str
    scope: str
    key: str
    to: str | None  # None: any recipient
    issuer: str
    uses_left: int
    used: int = 0
    revoked: bool = False


@dataclass
class Model:
    """Which live grant covers a call: the oldest not revoked, with a use
    left, in scope, not issued by the user who asks, whose constraint holds."""

    grants: list[Granted] = field(default_factory=list)

    def covering(self, user: str, conversation: str, to: str,
                 revoked_too: bool = False) -> Granted | None:
        for g in self.grants:
            in_scope = g.key == (conversation if g.scope == "conversation" else user)
            if ((revoked_too or not g.revoked) and g.uses_left > 0 and in_scope
                    and g.issuer != user and g.to in (None, to)):
                return g
        return None


@pytest.fixture
def hosted(temporal_server: DevServer, db: Database) -> Iterator[tuple[LoopThread, Turns]]:
    with hosted_worker(temporal_server.address, f"grants-{uuid.uuid4().hex[:8]}", db.url,
                       [service()], provider=FunctionModel(mailer)) as hosting:
        yield hosting


async def one_turn(turns: Turns, api: TurnstileClient, model: Model, tag: str,
                   step: tuple[Any, ...], exercised: set[str]) -> None:
    _, user_n, conv_n, to_n, decision = step
    # A conversation belongs to its user: each user has conversations c1 and c2.
    user, conversation = f"{user_n}-{tag}", f"{conv_n}-{user_n}-{tag}"
    to = ADDRESSES[to_n]
    expected = model.covering(user, conversation, to)
    if expected is None and model.covering(user, conversation, to, revoked_too=True):
        exercised.add("revoked")  # only its revocation keeps a grant from covering it
    handle = await turns.start(f"mail {to} note", service=SALES, user=user,
                               conversation=conversation)
    result = asyncio.ensure_future(handle.result())
    async with asyncio.timeout(60):  # no turn hangs
        while not result.done():
            pending = await handle.query(Handlers.PENDING_APPROVALS,
                                         result_type=list[PendingApproval])
            if pending:
                break
            await asyncio.wait([result], timeout=0.05)
    if result.done():  # it never waited: a grant approved it
        assert expected is not None, (step, "ran without a reviewer and no grant covers it")
        ended = result.result()
        assert ended.status is TurnStatus.COMPLETED, ended.error
        assert [c.status for c in ended.tool_calls] == [CallStatus.COMPLETED]
        rows = [r for r in audit_grants(turns.rt.db) if r["workflow_id"] == handle.id]
        assert [r["grant_id"] for r in rows] == [expected.grant_id]
        expected.uses_left -= 1
        expected.used += 1
        exercised.add("covered")
        return
    assert expected is None, (step, f"waited though {expected.grant_id} covers it")
    [waiting] = pending
    if decision[0] == "grant":
        _, scope, uses, pinned, issuer = decision
        who = user if issuer == "self" else "bob"
        request = GrantRequest(scope=GrantScope(scope), uses=uses, reason="property",
                               constraints={"to": Equals(value=to)} if pinned else {})
        try:
            taken = await api.review(handle.id, waiting.tool_call_id, True, who, grant=request)
        except ApprovalRefused:
            assert who == user, step  # only a self-grant is refused here
            taken = await api.review(handle.id, waiting.tool_call_id, True, "bob")
        else:
            assert who != user and taken.issued_grant, (step, taken)
            model.grants.append(Granted(
                grant_id=taken.issued_grant, scope=scope,
                key=conversation if scope == "conversation" else user,
                to=to if pinned else None, issuer=who, uses_left=uses))
    else:
        await api.review(handle.id, waiting.tool_call_id, decision[0] == "approve", "bob")
    ended = await asyncio.wait_for(result, 60)
    assert ended.status is TurnStatus.COMPLETED, ended.error


def test_grants_cover_exactly_what_the_rule_says(
        hosted: tuple[LoopThread, Turns], db: Database) -> None:
    lt, turns = hosted
    api = TurnstileClient(turns.client, turns.rt.settings)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.function_scoped_fixture])
    @given(steps=STEPS)
    def one(steps: list[tuple[Any, ...]]) -> None:
        model, tag = Model(), uuid.uuid4().hex[:8]
        for step in steps:
            if step[0] == "revoke":
                if model.grants:
                    g = model.grants[-1 - step[1] % len(model.grants)]  # 0: the newest
                    lt.run(api.revoke_grant(g.grant_id, "carol", "property"), 30)
                    g.revoked = True
                continue
            lt.run(one_turn(turns, api, model, tag, step, exercised), 120)
        for g in model.grants:
            stored = grant_store.get(db, g.grant_id)
            assert (stored.uses, stored.issued_by) == (g.used, g.issuer), (steps, g)
        assert truth.grant_disagreements_of(db) == [], steps

    exercised: set[str] = set()
    one()
    # The examples reached what the property is about: a call a grant covered,
    # and one a grant would have covered but for its revocation.
    assert exercised == {"covered", "revoked"}, exercised
