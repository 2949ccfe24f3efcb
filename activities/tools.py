"""Tool execution: one activity per tool call.

Order inside one attempt: validate arguments (an argument error is returned,
never retried) → consult the ledger (a finished call returns its stored
result; a call lost mid-run is re-run only if the tool is idempotent) → audit
INITIATED → run, heartbeating → the call journal's `finish`: ledger row,
audit row, approval decision and the result message at the slot the workflow
assigned, in one transaction. A raised error fails the attempt, so Temporal
retries it per the tool's policy.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.runtime import Runtime, application_error, turn_workflow_id, with_heartbeat
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import EXECUTE_TOOL, ToolExecInput, ToolOutcome
from turnstile.engine.contract import AuditStatus, CallStatus
from turnstile.engine.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    MCPServerUnavailable,
    MemoryConflictError,
    ToolArgumentError,
)
from turnstile.engine.masking import mask_json_text
from turnstile.engine.messages import ChatMessage
from turnstile.runtime.tools import (
    ToolContext,
    ToolExecutionError,
    ToolInterrupted,
    ToolResult,
    result_to_text,
)
from turnstile.runtime.tracing import record_tool_outcome, tool_span
from turnstile.stores.db import error_category
from turnstile.stores.journal import Ending
from turnstile.stores.memory import LedgerStatus

log = logging.getLogger(__name__)

PREVIEW_CHARS = 400
LISTING_HEARTBEAT_SECONDS = 1.5  # beats every 0.5 s while MCP servers are listed
INTERRUPTED_TEXT = (
    "The call to {name} was interrupted (its worker was lost mid-run) and this tool is not "
    "safe to run twice, so it was not repeated. It may or may not have taken effect: check "
    "its effect before trying again."
)


def _preview(text: str) -> str:
    """What the workflow (and so its history) keeps of a result: masked, bounded.
    The full result is in memory."""
    text = mask_json_text(text[: PREVIEW_CHARS * 8])
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def tool_message(call_id: str, name: str, text: str, status: CallStatus, is_error: bool,
                 wf_id: str) -> ChatMessage:
    return ChatMessage(
        role="tool", content=text, tool_call_id=call_id, is_error=is_error,
        attributes={attr.TOOL_NAME: name, attr.OUTCOME: status.value, attr.WORKFLOW_ID: wf_id},
    )


class ToolActivities:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @activity.defn(name=EXECUTE_TOOL)
    async def execute_tool(self, req: ToolExecInput) -> ToolOutcome:
        try:
            with tool_span(req.call.name, req.call.id, activity.info().attempt) as span:
                outcome = await self._execute(req)
                record_tool_outcome(span, outcome.status, outcome.is_error)
                return outcome
        except (DatabaseUnavailable, MemoryConflictError) as exc:
            raise application_error(
                exc, non_retryable=isinstance(exc, MemoryConflictError)
            ) from exc

    async def _finish(self, req: ToolExecInput, text: str, status: CallStatus,
                      is_error: bool, state: dict[str, Any] | None = None, *,
                      audit: AuditStatus = AuditStatus.FAILED, error: str | None = None,
                      ledger: bool = True) -> ToolOutcome:
        """Record how the call ended — ledger, audit row, approval decision,
        result message — in one transaction (turnstile.stores.journal)."""
        wf_id = turn_workflow_id()
        msg = tool_message(req.call.id, req.call.name, text, status, is_error, wf_id)
        if state:
            msg.attributes[attr.STATE] = state
        await asyncio.to_thread(self.rt.journal.finish, Ending(
            workflow_id=wf_id, chain=req.execution_chain, conversation_id=req.conversation_id,
            user_id=req.user_id, call=req.call, seq=req.result_seq, message=msg,
            audit_status=audit, audit_error=error, decision=req.approval, ledger=ledger,
            state=state))
        return ToolOutcome(call_id=req.call.id, name=req.call.name, status=status,
                           is_error=is_error, preview=_preview(text))

    async def _execute(self, req: ToolExecInput) -> ToolOutcome:
        info = activity.info()
        wf_id, call, chain = turn_workflow_id(), req.call, req.execution_chain
        service = self.rt.services.get(req.service)
        try:
            # An MCP tool this worker has not listed yet (e.g. after a restart) is
            # listed first; a server that cannot be reached fails the attempt.
            # Heartbeating meanwhile: opening sessions may outlast the tool's heartbeat timeout.
            tool = await with_heartbeat(service.find_tool(call.name), LISTING_HEARTBEAT_SECONDS)
        except ConfigurationError as exc:
            raise application_error(exc, non_retryable=True) from exc
        except MCPServerUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc
        if tool is None:  # the workflow checks names first; a stale spec can still get here
            text = f"Tool {call.name!r} does not exist."
            return await self._finish(req, text, CallStatus.UNKNOWN_TOOL, True, error=text,
                                      ledger=False)
        audit_log = self.rt.audit
        try:
            args = tool.parse_arguments(call.arguments)
            tool.check_outbound(args, service.outbound)
        except ToolArgumentError as exc:
            return await self._finish(req, str(exc), CallStatus.INVALID_ARGUMENTS, True,
                                      error=str(exc), ledger=False)

        entry = await asyncio.to_thread(
            self.rt.ledger.begin, wf_id, call.id, call.name, rerun_lost=tool.spec.idempotent,
            chain=chain)
        if entry.status is LedgerStatus.COMPLETED:
            # A finished attempt whose completion was lost: replay what it reported.
            status = entry.outcome or (
                CallStatus.FAILED if entry.is_error else CallStatus.COMPLETED)
            return await self._finish(
                req, entry.result or "", status, entry.is_error, entry.state,
                audit=AuditStatus.FAILED if entry.is_error else AuditStatus.COMPLETED,
                error=(entry.result or "")[:500] if entry.is_error else None, ledger=False)
        if not entry.fresh:
            return await self._interrupted(req, wf_id, "its worker was lost mid-run")

        await asyncio.to_thread(
            audit_log.started, workflow_id=wf_id, call_id=call.id,
            conversation_id=req.conversation_id, user_id=req.user_id, tool_name=call.name,
            arguments=call.arguments, chain=chain,
        )
        ctx = ToolContext(
            db=self.rt.db, workflow_id=wf_id, conversation_id=req.conversation_id,
            user_id=req.user_id, tool_call_id=call.id, attempt=info.attempt,
            settings=self.rt.settings, heartbeat=activity.heartbeat, execution_chain=chain,
            statement_timeout_seconds=tool.spec.statement_timeout_seconds,
        )
        try:
            result = await with_heartbeat(tool.invoke(ctx, args), tool.spec.heartbeat_seconds)
        except ToolInterrupted as exc:
            if not tool.spec.idempotent:
                # In flight when the connection broke: the effect is unknown, so
                # the call is settled as interrupted, never re-run.
                return await self._interrupted(req, wf_id, str(exc))
            await asyncio.to_thread(self.rt.ledger.attempt_failed, wf_id, call.id, str(exc),
                                    chain)
            await asyncio.to_thread(audit_log.finished, workflow_id=wf_id, call_id=call.id,
                                    status=AuditStatus.FAILED, error=str(exc), chain=chain)
            raise ApplicationError(str(exc), type="ToolExecutionError") from exc
        except ToolArgumentError as exc:
            # The tool's own validation (e.g. start after end): the model can fix it.
            return await self._finish(req, str(exc), CallStatus.INVALID_ARGUMENTS, True,
                                      error=str(exc))
        except Exception as exc:
            # Any other failure is an execution error: Temporal retries it per the tool's policy.
            retryable = not (isinstance(exc, ToolExecutionError) and not exc.retryable)
            error = (str(exc) if isinstance(exc, ToolExecutionError)
                     else f"{type(exc).__name__}: {exc}")
            category = error_category(exc)
            if category is not None:
                # The driver's text names hosts, roles, SQL: the log gets it; the
                # ledger, audit, memory and the model get the category.
                log.warning("tool %s (%s) attempt %d failed: %s", call.name, call.id,
                            info.attempt, error)
                error = f"{category}; tried {info.attempt} time(s)"
            await asyncio.to_thread(self.rt.ledger.attempt_failed, wf_id, call.id, error, chain)
            await asyncio.to_thread(audit_log.finished, workflow_id=wf_id, call_id=call.id,
                                    status=AuditStatus.FAILED, error=error, chain=chain)
            raise ApplicationError(error, type=ToolExecutionError.error_type,
                                   non_retryable=not retryable) from exc
        text = result_to_text(result)
        state = result.state if isinstance(result, ToolResult) else None
        if isinstance(result, ToolResult) and result.is_error:
            # The tool ran and reported a failure: an error result for the model.
            return await self._finish(req, text, CallStatus.FAILED, True, state,
                                      error=text[:500])
        return await self._finish(req, text, CallStatus.COMPLETED, False, state,
                                  audit=AuditStatus.COMPLETED)

    async def _interrupted(self, req: ToolExecInput, wf_id: str, error: str) -> ToolOutcome:
        call = req.call
        text = INTERRUPTED_TEXT.format(name=call.name)
        return await self._finish(req, text, CallStatus.INTERRUPTED, True,
                                  error=f"interrupted; effect unknown: {error}")
