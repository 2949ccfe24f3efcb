"""`turnstile.review_call`: a call is validated before a reviewer is asked
(and, from revision 5, before a guarded call the repeat breaker must compare
runs), so the reviewer decides on arguments that passed the tool's validation
and the service's outbound policy (full values, the fields that matter first,
notes such as "external recipient"). An invalid call never reaches a
reviewer: the workflow settles it as an argument error the model can correct.

A tool that asks for approval by condition (`@tool(approval=...)`) has its
condition evaluated here, on the validated arguments, with the call's
ToolContext (it may read the database): its reason (or None) is part of this
activity's result, so the turn's history records it and a replay follows it
(docs/approvals.md, "Approval by condition"). The activity heartbeats
while the condition, the information-flow derivation and the look-alike
search run: a slow one is waited for, a lost worker is noticed within the
heartbeat timeout (tests/test_worker_loss_review.py).

The result carries the validated call's comparison key (the repeat breaker's,
turnstile.engine.equivalence) and, for a call that waits for a reviewer, the
conversation's earlier effects of the tool that look alike: same effect by
meaning, or a review field (an e-mail's recipient or subject) equal by the
tool's equivalence; masked, newest first, within the service's
`similar_effects_window_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from temporalio import activity

from turnstile.activities import flow_sources
from turnstile.activities.runtime import (
    Activities,
    find_tool,
    turn_workflow_id,
    with_heartbeat,
)
from turnstile.activities.tool_calls import offered
from turnstile.engine.activity_io import REVIEW_CALL, ReviewCallInput, ReviewedCall
from turnstile.engine.contract import CallStatus, SimilarEffect
from turnstile.engine.errors import DatabaseUnavailable, ToolArgumentError
from turnstile.engine.flow import FlowRule, FlowVerdict
from turnstile.engine.masking import mask_json_text, mask_text
from turnstile.engine.provenance import derive
from turnstile.engine.turn_rules import parsed_arguments
from turnstile.runtime.services import Service
from turnstile.runtime.tools import Tool, ToolContext
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.db_errors import error_category
from turnstile.stores.effects import EarlierCall, calls_of
from turnstile.stores.person_approvals import approved_by_person

log = logging.getLogger(__name__)

# At most this many look-alikes are shown (the newest), each argument's text
# cut to VALUE_CHARS (an e-mail body is for the reviewer to open, not history).
MAX_SIMILAR = 5
VALUE_CHARS = 300
# Outcomes of a call whose effect exists or may exist.
EFFECTS = frozenset({CallStatus.COMPLETED.value, CallStatus.INTERRUPTED.value})


class ReviewActivities(Activities):
    @activity.defn(name=REVIEW_CALL)
    async def review_call(self, req: ReviewCallInput) -> ReviewedCall:
        service = self.service(req.service)
        tool = await find_tool(service, req.call.name)
        if tool is None:
            return ReviewedCall(valid=False, error=f"Tool {req.call.name!r} does not exist.")
        try:
            args = tool.parse_arguments(req.call.arguments)
            notes = tool.check_outbound(args, service.outbound)
        except ToolArgumentError as exc:
            return ReviewedCall(valid=False, error=str(exc))
        reviewed = ReviewedCall(valid=True, notes=notes, repeat_key=tool.repeat_key(args))
        if tool.spec.approval_condition:
            # The tool asks by condition: what it says now is recorded with this
            # activity's result, and the turn follows that record on replay.
            ctx = ToolContext(db=self.rt.db, workflow_id=turn_workflow_id(),
                              conversation_id=req.conversation_id, user_id=req.user_id,
                              tool_call_id=req.call.id, attempt=activity.info().attempt,
                              settings=self.rt.settings, heartbeat=activity.heartbeat,
                              statement_timeout_seconds=tool.spec.statement_timeout_seconds,
                              offered_tools=offered(service))
            # The app's code may take longer than the heartbeat timeout (a
            # slow query): the activity beats while it runs, or every attempt
            # would time out and run it again.
            reason = await with_heartbeat(tool.approval_reason(ctx, args))
            reviewed.reason = None if reason is None else mask_text(reason)
        if req.flow and tool.spec.sensitive:
            reviewed.flow = await with_heartbeat(self._flow(req, service, tool))
        waits = not tool.spec.approval_condition or reviewed.reason is not None
        if req.flow:  # only a call that will wait is shown its look-alikes
            waits = (tool.spec.requires_approval or reviewed.reason is not None
                     or reviewed.flow is not None and reviewed.flow.rule == "review")
        if req.similar and req.conversation_id and waits:
            try:
                reviewed.similar_effects = await with_heartbeat(self.rt.db.call(
                    similar_effects, self.rt.db, req, service, tool, args))
            except (sa.exc.SQLAlchemyError, sqlite3.Error, UnicodeDecodeError,
                    DatabaseUnavailable) as exc:
                # The reviewer decides without the list, told so: an outage
                # or a damaged row must not hold the call (nor retry for an hour).
                why = error_category(exc) or type(exc).__name__
                log.warning("earlier effects of conversation %s not read for call %s: %s",
                            req.conversation_id, req.call.id, exc)
                reviewed.notes.append(f"earlier calls of {tool.name} in this conversation "
                                      f"could not be read ({why}): check them before approving")
        return reviewed

    async def _flow(self, req: ReviewCallInput, service: Service, tool: Tool) -> FlowVerdict:
        """The information-flow verdict on the call (revision 7): its
        sensitive arguments matched against the conversation's labelled
        sources, and the values of its earlier calls a person approved. A
        conversation that cannot be read leaves the call to a reviewer, told
        so (fail closed: never `allow` unread)."""
        arguments = parsed_arguments(req.call.arguments)
        try:
            messages = await self.rt.db.call(
                self.rt.memory.tail, req.conversation_id, req.workflow_id or None,
                lambda msgs: len(msgs) >= flow_sources.MAX_MESSAGES) \
                if req.conversation_id else []
            ran = flow_sources.ran_calls(messages)
            approved = await self.rt.db.call(approved_by_person, self.rt.db, ran) \
                if ran else set()
        except (sa.exc.SQLAlchemyError, sqlite3.Error, UnicodeDecodeError, ValueError,
                DatabaseUnavailable) as exc:
            why = error_category(exc) or type(exc).__name__
            log.warning("conversation %s not read for the flow rules of call %s: %s",
                        req.conversation_id, req.call.id, exc)
            reason = (f"where {tool.name}'s arguments came from could not be checked "
                      f"(the conversation could not be read: {why})")
            rule: FlowRule = "refuse" if "refuse" in tool.spec.sensitive.values() else "review"
            return FlowVerdict(rule=rule, reason=reason, untrusted=list(tool.spec.sensitive))
        sources = flow_sources.labelled(service, messages, approved)
        # CPU-bound on a large conversation: off the event loop (bounded by
        # turnstile.engine.provenance's caps; review_call beats meanwhile).
        return await asyncio.to_thread(derive, tool.spec.sensitive, arguments, sources)


def similar_effects(db: Database, req: ReviewCallInput, service: Service, tool: Tool,
                    args: BaseModel) -> list[SimilarEffect]:
    """The conversation's earlier effects of `tool` that look like `args`."""
    with db.connect() as conn:
        return look_alikes(conn, req, service, tool, args)


def look_alikes(conn: Connection, req: ReviewCallInput, service: Service, tool: Tool,
                args: BaseModel) -> list[SimilarEffect]:
    key, forms = tool.repeat_key(args), tool.review_forms(args)
    earlier = calls_of(conn, req.conversation_id, tool.name, now=datetime.now(UTC),
                       window_seconds=service.similar_effects_window_seconds,
                       workflow_id=req.workflow_id)
    found: list[SimilarEffect] = []
    for e in earlier:
        if e.outcome not in EFFECTS or e.call.id == req.call.id and _same_turn(e, req):
            continue
        try:
            theirs = tool.parse_arguments(e.call.arguments)
        except ToolArgumentError:
            continue
        same = bool(key) and tool.repeat_key(theirs) == key
        alike = same or not forms or any(
            v == forms.get(f) for f, v in tool.review_forms(theirs).items())
        if alike:
            found.append(_effect(e, req, same))
        if len(found) >= MAX_SIMILAR:
            break
    return found


def _same_turn(e: EarlierCall, req: ReviewCallInput) -> bool:
    return e.workflow_id == req.workflow_id and e.execution_chain == req.execution_chain


def _effect(e: EarlierCall, req: ReviewCallInput, same: bool) -> SimilarEffect:
    return SimilarEffect(tool_name=e.call.name, tool_call_id=e.call.id, at=e.at,
                         status=e.outcome, arguments=bounded(parsed_arguments(
                             mask_json_text(e.call.arguments))),
                         this_turn=_same_turn(e, req), same_effect=same)


def bounded(value: Any, depth: int = 0) -> Any:
    """Masked arguments as a look-alike carries them: texts cut to
    VALUE_CHARS, at most 20 items a level, 4 levels deep."""
    if isinstance(value, str):
        return value if len(value) <= VALUE_CHARS else value[:VALUE_CHARS - 1] + "…"
    if depth >= 4 and isinstance(value, dict | list):
        return "…"
    if isinstance(value, dict):
        return {bounded(k): bounded(v, depth + 1) for k, v in list(value.items())[:20]}
    if isinstance(value, list):
        return [bounded(v, depth + 1) for v in value[:20]]
    return value
