"""`turnstile.review_call`: a call that needs approval is validated before a
reviewer is asked, so the reviewer decides on arguments that passed the
tool's validation and the service's outbound policy (full values, the
fields that matter first, notes such as "external recipient"). An invalid
call never reaches a reviewer: the workflow settles it as an argument error
the model can correct.

A tool that asks for approval by condition (`@tool(approval=...)`) has its
condition evaluated here, on the validated arguments, with the call's
ToolContext (it may read the database): its reason (or None) is this
activity's result, so the turn's history records it and a replay follows
it (docs/approvals.md, "Approval by condition").
"""

from __future__ import annotations

from temporalio import activity

from turnstile.activities.runtime import Activities, application_error, find_tool, turn_workflow_id
from turnstile.activities.tools import offered
from turnstile.engine.activity_io import REVIEW_CALL, ReviewCallInput, ReviewedCall
from turnstile.engine.errors import ToolArgumentError, UnknownServiceError
from turnstile.engine.masking import mask_text
from turnstile.runtime.tools import ToolContext


class ReviewActivities(Activities):
    @activity.defn(name=REVIEW_CALL)
    async def review_call(self, req: ReviewCallInput) -> ReviewedCall:
        try:
            service = self.rt.services.get(req.service)
        except UnknownServiceError as exc:
            raise application_error(exc, non_retryable=True) from exc
        tool = await find_tool(service, req.call.name)
        if tool is None:
            return ReviewedCall(valid=False, error=f"Tool {req.call.name!r} does not exist.")
        try:
            args = tool.parse_arguments(req.call.arguments)
            notes = tool.check_outbound(args, service.outbound)
        except ToolArgumentError as exc:
            return ReviewedCall(valid=False, error=str(exc))
        if not tool.spec.approval_condition:
            return ReviewedCall(valid=True, notes=notes)
        # The tool asks by condition: what it says now is recorded with this
        # activity's result, and the turn follows that record on replay.
        ctx = ToolContext(db=self.rt.db, workflow_id=turn_workflow_id(),
                          conversation_id=req.conversation_id, user_id=req.user_id,
                          tool_call_id=req.call.id, attempt=activity.info().attempt,
                          settings=self.rt.settings, heartbeat=activity.heartbeat,
                          statement_timeout_seconds=tool.spec.statement_timeout_seconds,
                          offered_tools=offered(service))
        reason = await tool.approval_reason(ctx, args)
        return ReviewedCall(valid=True, notes=notes,
                            reason=None if reason is None else mask_text(reason))
