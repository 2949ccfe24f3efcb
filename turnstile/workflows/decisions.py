"""Reviewers' decisions on a turn's pending approvals (docs/approvals.md):
who may decide, what takes effect, what is refused.

A decision arrives as the `approve`/`reject` signals or the `review` update
(workflows/approval_handlers.py), read from its raw payload by the product
(turnstile.engine.decision_payloads). It takes effect only for a call that
waits, from a reviewer the service's approver policy allows (names compared
as identities, turnstile.engine.identity: RFC 8265, and UTS #39's confusable
skeleton in every case; a name that is no identity — a lone surrogate, a
name RFC 8265 refuses, an empty one — decides nothing), bound to the
arguments the reviewer saw when it names their digest, and only once: the first decision
stands, later ones — and the approval deadline — are refused or ignored.
An approval may carry the reviewer's complete edited arguments: they are
checked again as the model's were (the tool's schema and validation, the
outbound policy: the `review_call` activity) before the decision is taken.

A refused decision is never silently dropped: it is in the status query
(bounded, counted), the log and the audit log (APPROVAL_REFUSED, written at
once by the handler); through `review` the reviewer gets the reason as a
`DecisionRefused` error, and on success the decision that took effect.

To add a way of deciding, build a `DecisionRequest` and `await
take(request)`, or call `decide` for a decision that needs no check of
edits. The decision itself is written by the turn's machine
(turnstile.engine.turn_machine: `decide`; a steer rejects every waiting
call there, `steer`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io
    from turnstile.engine.approvals import (
        NameRule,
        approval_refusal,
        arguments_digest,
        canonical_json,
    )
    from turnstile.engine.contract import ApprovalDecision, PendingApproval
    from turnstile.engine.decision_payloads import (
        DECISION_PAYLOAD_MAX,
        DecisionKind,
        DecisionRequest,
        Unreadable,
        oversize,
        read_decision,
    )
    from turnstile.engine.errors import DecisionRefused, RefusalKind
    from turnstile.engine.grant_models import Grant
    from turnstile.engine.masking import mask_prefix
    from turnstile.engine.messages import ToolCall
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.turn_input_rules import NOTE_MAX, clean_note
    from turnstile.engine.versions import (
        DECISIONS_READ_BY_PRODUCT,
        NAMES_AS_IDENTITIES,
        NAMES_BY_STANDARD,
        NAMES_CASE_BLIND,
        REFUSALS_AUDITED_AT_ONCE,
    )
    from turnstile.workflows import standing_approvals as standing
    from turnstile.workflows.state import TurnState, TurnStopped, failure_reason


@dataclass(frozen=True)
class Refused:
    """A decision that was not applied, and why (already audited and in the
    status query's refused signals)."""

    reason: str
    kind: RefusalKind = RefusalKind.REFUSED


# Checking edited arguments is a `review_call` activity awaited by the
# reviewer's update: short, few retries (a refusal says it could not check).
EDIT_CHECK_TIMEOUT = timedelta(seconds=15)
EDIT_CHECK_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=0.5))


def decoded(args: Sequence[RawValue]) -> tuple[Any, int, str | None]:
    """(value, size in bytes, problem) of a handler's raw payloads: the one
    JSON value a decision is, never decoded past DECISION_PAYLOAD_MAX."""
    if len(args) != 1:
        return None, 0, f"expected one payload (the decision), got {len(args)}"
    payload = args[0].payload
    size = len(payload.data)
    if size > DECISION_PAYLOAD_MAX:
        return None, size, None  # read_decision/oversize say so, unread
    encoding = payload.metadata.get("encoding", b"").decode("utf-8", "replace")
    if encoding != "json/plain":
        return None, size, f"encoding {encoding[:40]!r} is not JSON"
    try:
        return json.loads(payload.data), size, None
    except (ValueError, RecursionError) as exc:
        return None, size, f"not JSON ({str(exc)[:80]})"


class Decisions:
    def __init__(self, s: TurnState, spec: Callable[[], ServiceSpec]) -> None:
        self.s, self.spec = s, spec
        # Waiting calls a grant just issued is being claimed for: a reviewer's
        # decision on one is refused meanwhile (the claim may count a use).
        self.offering: set[str] = set()

    # -- the doors ---------------------------------------------------------------
    async def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Any signal: `approve` and `reject` are decisions; anything else is refused."""
        kinds = {k.value: k for k in (DecisionKind.APPROVE, DecisionKind.REJECT)}
        kind = kinds.get(name)
        if kind is None:
            await self.unreadable(Unreadable(
                verb=clean_note(name)[:60] or "signal", tool_call_id="", reviewer="",
                reason=f"unknown signal {_quoted(name)} (this turn takes approve, reject)"),
                "signal")
            return
        value, size, problem = decoded(args)
        read = (Unreadable(verb=kind.value, tool_call_id="", reviewer="",
                           reason=f"unreadable {kind.value} payload: {problem}")
                if problem else read_decision(kind, value, size=size, cut_note=True))
        if isinstance(read, Unreadable):
            await self.unreadable(read, f"signal {kind.value}")
            return
        await self.take(read, f"signal {kind.value}")

    def validate_review(self, args: Sequence[RawValue]) -> None:
        """The `review` update's validator: refuses only what must not enter
        history (over the size limits). Everything else is accepted, so its
        refusal is recorded and audited by the handler."""
        value, size, _ = decoded(args)
        problem = oversize(DecisionKind.REVIEW, value, size)
        if problem:
            raise ApplicationError(problem, type=DecisionRefused.error_type, non_retryable=True)

    async def on_review(self, args: Sequence[RawValue]) -> ApprovalDecision:
        """The decision that took effect; refused (audited) with the reason."""
        value, size, problem = decoded(args)
        read = (Unreadable(verb="review", tool_call_id="", reviewer="",
                           reason=f"unreadable review payload: {problem}")
                if problem else read_decision(DecisionKind.REVIEW, value, size=size,
                                              cut_note=False))
        if isinstance(read, Unreadable):
            await self.unreadable(read, "update review")
            raise ApplicationError(read.reason, type=DecisionRefused.error_type,
                                   non_retryable=True)
        taken = await self.take(read, "update review")
        if isinstance(taken, Refused):
            raise ApplicationError(taken.reason, taken.kind, type=DecisionRefused.error_type,
                                   non_retryable=True)
        return taken

    # -- the rules ---------------------------------------------------------------
    def refusal(self, call_id: str, reviewer: str, *, replaying_rules: bool = True,
                digest: str | None = None) -> str | None:
        """Why this decision may not be applied (None: it may).
        `replaying_rules=False` applies today's rules without asking which
        rules the turn's history followed."""
        s = self.s
        pending = s.pending.get(call_id)
        if call_id in s.decisions:
            return f"tool call {_quoted(call_id)} was already decided"
        if call_id in self.offering:
            return (f"a standing approval just issued is being applied to tool call "
                    f"{_quoted(call_id)}; look again")
        if pending is None:
            return (f"no pending approval for tool call {_quoted(call_id)}; pending: "
                    f"{sorted(s.pending) or 'none'}")
        if digest is not None and digest != _digest(pending):
            return (f"stale decision: the call's arguments changed since the reviewer saw "
                    f"them (digest {_quoted(digest[:16])}..., the pending call's is "
                    f"{_digest(pending)[:16]}...); look again")
        requester = s.turn.user_id if s.turn is not None else ""

        def by(rule: NameRule) -> str | None:
            return approval_refusal(self.spec().approvals, tool=pending.tool_name,
                                    reviewer=reviewer, requester=requester, rule=rule)

        today = by(NameRule.CASE_BLIND)
        if not replaying_rules or s.revision.names_by_todays_rule:
            return today
        # A turn begun before revision 4: only where two rules disagree does
        # it matter which one it follows, and a decision taken by an earlier
        # rule replays as it was taken.
        earlier = self._earlier_rules(by)
        if (today is None) != (earlier is None) and workflow.patched(NAMES_CASE_BLIND):
            return today
        return today if (today is None) == (earlier is None) else earlier

    @staticmethod
    def _earlier_rules(by: Callable[[NameRule], str | None]) -> str | None:
        """The refusal by the rules before revision 4, as turns begun then
        decided (and asked their patches, in their order)."""
        standard = by(NameRule.STANDARD)
        nfkc = by(NameRule.NFKC)
        if (standard is None) != (nfkc is None) and workflow.patched(NAMES_BY_STANDARD):
            return standard
        if (standard is None) != (nfkc is None):
            standard = nfkc  # the v0.3 rule, as this turn's history took it
        before = by(NameRule.SPELLING)
        if (standard is None) != (before is None) and not workflow.patched(NAMES_AS_IDENTITIES):
            return before
        return standard

    async def take(self, r: DecisionRequest, door: str) -> ApprovalDecision | Refused:
        """Check `r` (edits included) and apply it, or refuse it (audited).
        Without edits nothing is awaited before the decision is applied."""
        reason = self.refusal(r.tool_call_id, r.reviewer, digest=r.digest)
        arguments = r.arguments
        if reason is None and arguments is not None:
            reason, arguments = await self._check_edits(r)
            if reason is None:  # another decision may have won while the edits were checked
                reason = self.refusal(r.tool_call_id, r.reviewer, digest=r.digest)
        issued: Grant | None = None
        if reason is None and r.grant is not None:
            reason, issued = await self._issue(r, arguments)
        if reason:
            await self._refused(r.tool_call_id, r.verb, r.reviewer, reason, door,
                                edited=r.arguments)
            return Refused(reason, self._kind(r.tool_call_id))
        taken = self.decide(r.tool_call_id, r.approved, r.reviewer, r.note, arguments=arguments,
                            issued_grant=issued.grant_id if issued else None)
        if issued is not None and not isinstance(taken, Refused):
            await self._offer_waiting(issued)
        return taken

    async def _issue(self, r: DecisionRequest, arguments: dict[str, Any] | None
                     ) -> tuple[str | None, Grant | None]:
        """(why the grant is refused, the grant issued): issued only in a
        turn begun at the revision of standing approvals, for a decision that
        still applies once it is stored (else revoked again)."""
        s = self.s
        turn = s.turn
        if not s.revision.standing_approvals or turn is None:
            return "this turn began before standing approvals (grants); approve without one", None
        assert r.grant is not None
        pending = s.pending[r.tool_call_id]
        call = ToolCall(id=r.tool_call_id, name=pending.tool_name,
                        arguments=canonical_json(arguments if arguments is not None
                                                 else pending.arguments))
        try:
            issued = await s.execute(
                io.issue_grant, io.IssueGrantInput(
                    service=turn.service, call=call, conversation_id=turn.conversation_id,
                    user_id=turn.user_id, reviewer=clean_note(r.reviewer)[:200],
                    request=r.grant, execution_chain=s.chain),
                f"grant {pending.tool_name}",
                {"start_to_close_timeout": EDIT_CHECK_TIMEOUT, "retry_policy": EDIT_CHECK_RETRY})
        except ActivityError as exc:
            return f"the grant could not be issued: {failure_reason(exc)}", None
        if issued.grant is None:
            return f"the grant was refused: {issued.refused}", None
        late = self.refusal(r.tool_call_id, r.reviewer, digest=r.digest)
        if late is not None:  # another decision won while the grant was stored
            await s.execute(io.revoke_grant, io.RevokeGrantInput(
                grant_id=issued.grant.grant_id, by="turn",
                reason=f"its approval was refused: {late}"[:300]),
                f"revoke grant {issued.grant.grant_id}",
                {"start_to_close_timeout": EDIT_CHECK_TIMEOUT,
                 "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1))})
            return late, None
        return None, issued.grant

    async def _offer_waiting(self, grant: Grant) -> None:
        """The turn's other calls waiting for a reviewer, offered to a grant
        just issued: each it covers (claimed, re-checked) is approved by it."""
        s = self.s
        for call_id, pending in list(s.pending.items()):
            if call_id in s.decisions or pending.tool_name != grant.tool_name:
                continue
            call = ToolCall(id=call_id, name=pending.tool_name,
                            arguments=canonical_json(pending.arguments))
            self.offering.add(call_id)
            try:
                claimed = await standing.offered(s, call)
            finally:
                self.offering.discard(call_id)
            if (claimed is not None and claimed.grant_id and call_id in s.pending
                    and call_id not in s.decisions):
                s.machine.decide(standing.covered(call, claimed))

    def decide(self, call_id: str, approved: bool, reviewer: str, note: str, *,
               arguments: dict[str, Any] | None = None,
               issued_grant: str | None = None) -> ApprovalDecision | Refused:
        """Apply a decision already checked by `take` (or one the turn takes
        itself): the decision that took effect, or Refused (queued for audit)."""
        s = self.s
        reason = self.refusal(call_id, reviewer)
        if reason:
            pending = s.pending.get(call_id)
            verb = "approve" if approved else "reject"
            s.refuse(clean_note(call_id)[:200], pending.tool_name if pending else "", verb,
                     clean_note(reviewer)[:200], _refusal_text(verb, reviewer, call_id, reason))
            return Refused(reason, self._kind(call_id))
        return s.machine.decide(ApprovalDecision(
            tool_call_id=call_id, tool_name=s.pending[call_id].tool_name, approved=approved,
            reviewer=clean_note(reviewer)[:200], note=clean_note(mask_prefix(note, NOTE_MAX)),
            decided_at=workflow.now().isoformat(), arguments=arguments,
            issued_grant=issued_grant))

    def _kind(self, call_id: str) -> RefusalKind:
        """The kind of a refusal just given for `call_id`: `refusal` puts the
        call's own earlier decision before every other reason."""
        return (RefusalKind.ALREADY_DECIDED if call_id in self.s.decisions
                else RefusalKind.REFUSED)

    async def _check_edits(self, r: DecisionRequest) -> tuple[str | None, dict[str, Any] | None]:
        """(why the edited arguments are refused, the arguments to run with:
        None when they equal the model's)."""
        pending = self.s.pending[r.tool_call_id]
        assert r.arguments is not None
        if not r.approved:
            return "edited arguments come only with an approval", None
        try:
            edited = canonical_json(r.arguments)
        except (ValueError, TypeError, RecursionError) as exc:
            return f"the edited arguments cannot be written as JSON: {exc}", None
        if isinstance(pending.arguments, dict) and edited == canonical_json(pending.arguments):
            return None, None  # no edit: a plain approval
        tool = self.spec().tool(pending.tool_name)
        limit = tool.max_argument_bytes if tool is not None else 64 * 1024
        if len(edited.encode("utf-8", "surrogatepass")) > limit:
            return (f"the edited arguments are over {pending.tool_name}'s limit of "
                    f"{limit} bytes"), None
        turn = self.s.turn
        assert turn is not None
        call = ToolCall(id=r.tool_call_id, name=pending.tool_name, arguments=edited)
        try:
            reviewed = await self.s.execute(
                io.review_call, io.ReviewCallInput(service=turn.service, call=call),
                f"check edited {pending.tool_name}",
                {"start_to_close_timeout": EDIT_CHECK_TIMEOUT, "retry_policy": EDIT_CHECK_RETRY})
        except ActivityError as exc:
            return f"the edited arguments could not be checked: {failure_reason(exc)}", None
        if not reviewed.valid:
            return f"the edited arguments were refused: {reviewed.error}", None
        return None, r.arguments

    # -- refusals ----------------------------------------------------------------
    async def unreadable(self, read: Unreadable, door: str) -> None:
        """A payload that is no decision: refused and recorded — except in a
        turn begun before the product read payloads, which replays as the SDK
        dropped it."""
        if not workflow.patched(DECISIONS_READ_BY_PRODUCT):
            workflow.logger.warning("dropped %s: %s", door, read.reason[:200])
            return
        await self._refused(read.tool_call_id, read.verb, read.reviewer, read.reason, door)

    async def _refused(self, call_id: str, verb: str, reviewer: str, reason: str, door: str,
                       edited: dict[str, Any] | None = None) -> None:
        """Record a refusal; audit it at once once the turn has begun (else
        when its round or the turn ends)."""
        s = self.s
        pending = s.pending.get(call_id)
        details: dict[str, object] = {"door": door}
        if edited is not None:
            text = _json_or_none(edited)
            details["arguments"] = (json.loads(text) if text is not None and len(text) <= 4000
                                    else "(edited arguments, not kept: over 4000 characters)")
        at_once = s.begun and s.turn is not None and workflow.patched(REFUSALS_AUDITED_AT_ONCE)
        entry = s.refuse(clean_note(call_id)[:200] or "(no call)",
                         pending.tool_name if pending else "", verb, clean_note(reviewer)[:200],
                         _refusal_text(verb, reviewer, call_id, reason), queue=not at_once,
                         details=details)
        if not at_once:
            return
        try:
            await s.append([], audit=[entry])
        except TurnStopped as stop:  # written with the round's or the turn's end instead
            workflow.logger.warning("refusal not audited yet: %s", stop)
            s.refusals.append(entry)


def _digest(pending: PendingApproval) -> str:
    return pending.arguments_digest or arguments_digest(pending.arguments)


def _json_or_none(value: Any) -> str | None:
    try:
        return canonical_json(value)
    except (ValueError, TypeError, RecursionError):
        return None


def _refusal_text(verb: str, reviewer: str, call_id: str, reason: str) -> str:
    return f"{verb} by {_quoted(reviewer)} for {_quoted(call_id)} refused: {reason}"


def _quoted(text: str) -> str:
    return repr(clean_note(text)[:200]).encode("ascii", "backslashreplace").decode("ascii")
