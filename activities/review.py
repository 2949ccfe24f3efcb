"""`turnstile.review_call`: a call that needs approval is validated before a
reviewer is asked, so the reviewer decides on arguments that passed the
tool's validation and the service's outbound policy (full values, the
fields that matter first, notes such as "external recipient"). An invalid
call never reaches a reviewer: the workflow settles it as an argument error
the model can correct.
"""

from __future__ import annotations

from temporalio import activity

from activities.runtime import Activities, application_error, find_tool
from turnstile.engine.activity_io import REVIEW_CALL, ReviewCallInput, ReviewedCall
from turnstile.engine.errors import ToolArgumentError, UnknownServiceError


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
        return ReviewedCall(valid=True, notes=notes)
