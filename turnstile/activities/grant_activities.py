"""Standing approvals in a turn (revision 8; docs/approvals.md, "Standing
approvals (grants)"):

- `turnstile.claim_grant`: before a call would wait for a reviewer, the
  first live grant that covers it is claimed — one use, once per call
  (turnstile.stores.grant_store.claim): covered, the call runs without waiting.
  Otherwise the answer says what a reviewer may grant for it (the tool's
  ceiling) and which live grants did not cover it, and why.
- `turnstile.issue_grant`: a reviewer's approval carries `grant`; it is
  checked against the operator's ceiling for the tool (refused beyond it,
  with the reason) and stored under the issuing call's id, so a retried
  attempt issues nothing twice.
- `turnstile.revoke_grant`: the turn revokes a grant it issued for a
  decision that lost its race to another.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from temporalio import activity

from turnstile.activities.runtime import Activities, find_tool, turn_workflow_id
from turnstile.engine import identity
from turnstile.engine.activity_io import (
    CLAIM_GRANT,
    ISSUE_GRANT,
    REVOKE_GRANT,
    ClaimGrantInput,
    GrantClaim,
    IssuedGrant,
    IssueGrantInput,
    RevokeGrantInput,
)
from turnstile.engine.grant_models import Grant, GrantScope
from turnstile.engine.grant_rules import GrantRefused, settle_request
from turnstile.stores import grant_store as store
from turnstile.stores.tables import stored_time


def _arguments(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


class GrantActivities(Activities):
    @activity.defn(name=CLAIM_GRANT)
    async def claim_grant(self, req: ClaimGrantInput) -> GrantClaim:
        service = self.service(req.service)
        ceiling = service.grant_ceiling(req.call.name)
        if not ceiling.allowed:
            return GrantClaim()
        tool = await find_tool(service, req.call.name)
        review_fields = list(tool.spec.review_fields) if tool is not None else []
        claimed = await self.rt.db.call(store.claim, self.rt.db, store.CallOf(
            workflow_id=turn_workflow_id(), chain=req.execution_chain,
            tool_call_id=req.call.id, service=req.service, tool_name=req.call.name,
            conversation_id=req.conversation_id, user_id=req.user_id,
            arguments=_arguments(req.call.arguments), untrusted=req.untrusted))
        if claimed.grant is not None:
            return GrantClaim(grant_id=claimed.grant.grant_id,
                              issued_by=claimed.grant.issued_by)
        return GrantClaim(ceiling=ceiling,
                          default_fields=list(dict.fromkeys([*ceiling.fixed_fields,
                                                             *review_fields])),
                          candidates=claimed.candidates)

    @activity.defn(name=ISSUE_GRANT)
    async def issue_grant(self, req: IssueGrantInput) -> IssuedGrant:
        service = self.service(req.service)
        if identity.same_person(req.reviewer, req.user_id):
            return IssuedGrant(refused="the user who asked for the call may not grant it "
                                       "(no self-grants)")
        tool = await find_tool(service, req.call.name)
        if tool is None:
            return IssuedGrant(refused=f"tool {req.call.name!r} does not exist")
        wf_id = turn_workflow_id()
        grant_id = store.grant_id_for(wf_id, req.execution_chain, req.call.id)
        try:
            # A retried attempt finds the grant its first attempt stored.
            return IssuedGrant(grant=await self.rt.db.call(store.get, self.rt.db, grant_id))
        except store.GrantNotFound:
            pass
        now = datetime.now(UTC)
        try:
            until, uses, constraints = settle_request(
                req.request, service.grant_ceiling(req.call.name), tool=req.call.name,
                arguments=_arguments(req.call.arguments),
                review_fields=tool.spec.review_fields, now=now)
        except GrantRefused as refused:
            return IssuedGrant(refused=str(refused))
        scope_key = {GrantScope.CONVERSATION: req.conversation_id,
                     GrantScope.USER: req.user_id,
                     GrantScope.SERVICE: req.service}[req.request.scope]
        grant = Grant(grant_id=grant_id, service=req.service, tool_name=req.call.name,
                      scope=req.request.scope, scope_key=scope_key, constraints=constraints,
                      until=stored_time(until), max_uses=uses,
                      covers_untrusted=req.request.covers_untrusted, issued_by=req.reviewer,
                      issued_at=stored_time(now), reason=req.request.reason,
                      workflow_id=wf_id, tool_call_id=req.call.id, requested_by=req.user_id)
        return IssuedGrant(grant=await self.rt.db.call(store.issue, self.rt.db, grant,
                                                       req.execution_chain))

    @activity.defn(name=REVOKE_GRANT)
    async def revoke_grant(self, req: RevokeGrantInput) -> None:
        await self.rt.db.call(store.revoke, self.rt.db, req.grant_id, req.by, req.reason)
