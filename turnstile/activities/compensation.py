"""Compensations: undo a completed call, then make memory and the audit log
say so. Each runs as its own retried activity, scheduled by the workflow in
reverse order of completion.

A compensation that writes to the database does so in the call journal's
transaction (ToolContext.transaction), which then rewrites the call's result
message and closes its audit row before the one commit (`CallJournal.compensated`):
the undo and its record commit together or not at all. A retry after a lost
worker finds either both — memory already says rolled back, and that is
returned without undoing twice — or neither, and undoes. A worker that shuts
down mid-undo hands the attempt back (an undo is safe to run again).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from temporalio import activity

from turnstile.activities.runtime import (
    Activities,
    application_error,
    turn_workflow_id,
    with_heartbeat,
)
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
from turnstile.engine.masking import mask_text
from turnstile.runtime.tools import ToolContext, Undo, result_to_text
from turnstile.stores.journal import Undone
from turnstile.stores.ledger import LedgerStatus
from turnstile.stores.transaction import Transaction

log = logging.getLogger(__name__)

UNDO_MARK = " Undo: "
# A call cancelled mid-run is waited for at most this share of its tool's
# start-to-close timeout (the compensation's own), leaving the rest to the undo.
IN_FLIGHT_SHARE = 0.5
IN_FLIGHT_POLL_SECONDS = 0.2


def rolled_back_text(name: str, cause: RollbackCause, description: str) -> str:
    return (f"ROLLED BACK: this call to {name} was undone because the turn failed "
            f"({cause.type}: {cause.message}). Its effect no longer exists."
            f"{UNDO_MARK}{description}")


class SagaActivities(Activities):
    @activity.defn(name=COMPENSATE_TOOL)
    async def compensate_tool(self, req: CompensateInput) -> CompensateResult:
        wf_id, call = turn_workflow_id(), req.call
        tool = self.rt.services.get(req.service).tool(call.name)
        if tool is None or tool.compensate is None:
            raise application_error(NoCompensation(f"{call.name} declares no compensation"),
                                    non_retryable=True)
        chain = req.execution_chain
        recorded = await self.rt.db.call(self.rt.journal.rolled_back, req.conversation_id,
                                         call.id, wf_id, chain)
        if recorded is not None:  # an earlier attempt undid it and recorded that
            return CompensateResult(call_id=call.id,
                                    description=recorded.partition(UNDO_MARK)[2] or recorded)
        await self._in_flight_ended(wf_id, call.id, chain,
                                    tool.spec.start_to_close_seconds * IN_FLIGHT_SHARE)
        raw = await self.rt.db.call(self.rt.ledger.result, wf_id, call.id, chain)
        try:
            stored: Any = json.loads(raw or "null")
        except ValueError:
            stored = raw
        tx = self.rt.journal.transaction()
        ctx = ToolContext(db=self.rt.db, workflow_id=wf_id, conversation_id=req.conversation_id,
                          user_id=req.user_id, tool_call_id=call.id,
                          attempt=activity.info().attempt, settings=self.rt.settings,
                          heartbeat=activity.heartbeat, execution_chain=chain,
                          statement_timeout_seconds=tool.spec.statement_timeout_seconds,
                          journal_tx=tx)
        try:
            work = tool.undo(ctx, tool.parse_arguments(call.arguments), stored)
            outcome = await with_heartbeat(work, tool.spec.heartbeat_seconds, hand_back=True)
            # The record joins the undo's transaction: heartbeat while it waits for locks.
            return await with_heartbeat(self._record(req, wf_id, outcome, tx))
        finally:
            tx.release()  # rolls back an undo whose record was not committed

    async def _in_flight_ended(self, wf_id: str, call_id: str, chain: str,
                               bound: float) -> None:
        """Undo only what has ended: a call cancelled while its thread ran is
        still STARTED until that thread ends and its attempt records what it
        did (activities.tool_calls). Waited for at most `bound` seconds — a claim
        whose worker was lost never ends —, heartbeating."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound
        while await self.rt.db.call(self.rt.ledger.status, wf_id, call_id,
                                    chain) is LedgerStatus.STARTED:
            if loop.time() > deadline:
                log.warning("call %s is still claimed by an attempt after %.0f s: undoing "
                            "without its result", call_id, bound)
                return
            activity.heartbeat()
            await asyncio.sleep(IN_FLIGHT_POLL_SECONDS)

    async def _record(self, req: CompensateInput, wf_id: str, outcome: Any,
                      tx: Transaction) -> CompensateResult:
        call, chain = req.call, req.execution_chain
        if isinstance(outcome, Undo) and not outcome.undone:
            await self.rt.db.call(self.rt.journal.compensated,
                                  effect_remains(req, wf_id, outcome.description), tx)
            return CompensateResult(call_id=call.id, description=mask_text(outcome.description),
                                    undone=False)
        description = outcome.description if isinstance(outcome, Undo) else result_to_text(outcome)
        await self.rt.db.call(self.rt.journal.compensated, Undone(
            workflow_id=wf_id, chain=chain, conversation_id=req.conversation_id,
            call_id=call.id, text=rolled_back_text(call.name, req.cause, description),
            attributes={attr.ROLLED_BACK: True, attr.ROLLBACK_CAUSE: req.cause.model_dump()},
            audit_status=AuditStatus.ROLLED_BACK, audit_error=f"rolled back: {req.cause.message}",
        ), tx)
        return CompensateResult(call_id=call.id, description=mask_text(description))

    @activity.defn(name=RECORD_COMPENSATION_FAILURE)
    def record_compensation_failure(self, req: CompensationFailure) -> None:
        """A compensation that kept failing is a state, not a log line."""
        wf_id = turn_workflow_id()
        text = (f"WARNING: the turn failed ({req.cause.type}: {req.cause.message}) "
                f"and undoing this call to {req.call.name} failed ({req.error}). Its effect MAY "
                "STILL EXIST: check before relying on it or repeating it.")
        self.rt.journal.compensated(Undone(
            workflow_id=wf_id, chain=req.execution_chain, conversation_id=req.conversation_id,
            call_id=req.call.id, text=text,
            attributes={attr.EFFECT_MAY_REMAIN: True, attr.ROLLBACK_CAUSE: req.cause.model_dump()},
            audit_status=AuditStatus.COMPENSATION_FAILED, audit_error=req.error))


def effect_remains(req: CompensateInput, wf_id: str, description: str) -> Undone:
    """The record of an undo that could not remove the effect (an e-mail already sent)."""
    text = (f"NOT UNDONE: the turn failed ({req.cause.type}: "
            f"{req.cause.message}) but this call to {req.call.name} could not be "
            f"undone and its effect remains: {description}")
    return Undone(
        workflow_id=wf_id, chain=req.execution_chain, conversation_id=req.conversation_id,
        call_id=req.call.id, text=text,
        attributes={attr.EFFECT_MAY_REMAIN: True, attr.ROLLBACK_CAUSE: req.cause.model_dump()},
        audit_status=AuditStatus.COMPENSATION_FAILED, audit_error=f"effect remains: {description}")
