"""Compensations: undo a completed call, then make memory and the audit log
say so. Each runs as its own retried activity, scheduled by the workflow in
reverse order of completion."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio import activity

from activities.runtime import Runtime, application_error, turn_workflow_id, with_heartbeat
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import (
    COMPENSATE_TOOL,
    RECORD_COMPENSATION_FAILURE,
    CompensateInput,
    CompensateResult,
    CompensationFailure,
)
from turnstile.engine.contract import AuditStatus, RollbackCause
from turnstile.engine.errors import NoCompensation
from turnstile.runtime.tools import ToolContext, Undo, result_to_text


def rolled_back_text(name: str, cause: RollbackCause, description: str) -> str:
    return (f"ROLLED BACK: this call to {name} was undone because the turn failed "
            f"({cause.type}: {cause.message}). Its effect no longer exists. "
            f"Undo: {description}")


class SagaActivities:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @activity.defn(name=COMPENSATE_TOOL)
    async def compensate_tool(self, req: CompensateInput) -> CompensateResult:
        info = activity.info()
        wf_id, call = turn_workflow_id(), req.call
        tool = self.rt.services.get(req.service).tool(call.name)
        if tool is None or tool.compensate is None:
            raise application_error(NoCompensation(f"{call.name} declares no compensation"),
                                    non_retryable=True)
        chain = req.execution_chain
        raw = await asyncio.to_thread(self.rt.ledger.result, wf_id, call.id, chain)
        try:
            stored: Any = json.loads(raw or "null")
        except ValueError:
            stored = raw
        ctx = ToolContext(db=self.rt.db, workflow_id=wf_id, conversation_id=req.conversation_id,
                          user_id=req.user_id, tool_call_id=call.id, attempt=info.attempt,
                          settings=self.rt.settings, heartbeat=activity.heartbeat,
                          execution_chain=chain,
                          statement_timeout_seconds=tool.spec.statement_timeout_seconds)
        work = tool.undo(ctx, tool.parse_arguments(call.arguments), stored)
        outcome = await with_heartbeat(work, tool.spec.heartbeat_seconds)
        if isinstance(outcome, Undo) and not outcome.undone:
            await asyncio.to_thread(self._effect_remains, req, wf_id, outcome.description)
            return CompensateResult(call_id=call.id, description=outcome.description,
                                    undone=False)
        description = outcome.description if isinstance(outcome, Undo) else result_to_text(outcome)
        await asyncio.to_thread(
            self.rt.memory.rewrite_tool_result, req.conversation_id, call.id,
            rolled_back_text(call.name, req.cause, description),
            {attr.ROLLED_BACK: True, attr.ROLLBACK_CAUSE: req.cause.model_dump()},
            workflow_id=wf_id, chain=chain,
        )
        await asyncio.to_thread(self.rt.audit.finished, workflow_id=wf_id, call_id=call.id,
                                status=AuditStatus.ROLLED_BACK,
                                error=f"rolled back: {req.cause.message}", chain=chain)
        return CompensateResult(call_id=call.id, description=description)

    def _effect_remains(self, req: CompensateInput, wf_id: str, description: str) -> None:
        text = (f"NOT UNDONE: the turn failed ({req.cause.type}: "
                f"{req.cause.message}) but this call to {req.call.name} could not be "
                f"undone and its effect remains: {description}")
        self.rt.memory.rewrite_tool_result(
            req.conversation_id, req.call.id, text,
            {attr.EFFECT_MAY_REMAIN: True, attr.ROLLBACK_CAUSE: req.cause.model_dump()},
            workflow_id=wf_id, chain=req.execution_chain)
        self.rt.audit.finished(workflow_id=wf_id, call_id=req.call.id,
                               status=AuditStatus.COMPENSATION_FAILED,
                               error=f"effect remains: {description}", chain=req.execution_chain)

    @activity.defn(name=RECORD_COMPENSATION_FAILURE)
    def record_compensation_failure(self, req: CompensationFailure) -> None:
        """A compensation that kept failing is a state, not a log line."""
        wf_id = turn_workflow_id()
        text = (f"WARNING: the turn failed ({req.cause.type}: {req.cause.message}) "
                f"and undoing this call to {req.call.name} failed ({req.error}). Its effect MAY "
                "STILL EXIST: check before relying on it or repeating it.")
        self.rt.memory.rewrite_tool_result(
            req.conversation_id, req.call.id, text,
            {attr.EFFECT_MAY_REMAIN: True, attr.ROLLBACK_CAUSE: req.cause.model_dump()},
            workflow_id=wf_id, chain=req.execution_chain)
        self.rt.audit.finished(workflow_id=wf_id, call_id=req.call.id,
                               status=AuditStatus.COMPENSATION_FAILED, error=req.error,
                               chain=req.execution_chain)
