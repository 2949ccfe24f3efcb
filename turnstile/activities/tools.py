"""Tool execution: one activity per tool call.

Order inside one attempt, heartbeating throughout: validate arguments (an
argument error is returned, never retried) → the call journal's `begin`:
claim the call in the ledger and open its audit row, in one transaction (a
finished call returns its stored result; a call lost mid-run is re-run only
if the tool is idempotent or transactional, otherwise settled as
interrupted) → run the tool → the journal's `finish`: ledger row, audit row,
approval decision and the result message at the slot the workflow assigned,
in one transaction. A tool that writes to the database does so in that same
transaction (ToolContext.transaction), so its effect and its record commit
together or not at all. A raised error fails the attempt, so Temporal
retries it per the tool's policy.

A worker that shuts down (SIGTERM, after its grace period) while a tool
runs hands the attempt back when the call may run again (idempotent, or
transactional: its writes roll back), so another worker runs it at once;
any other call is settled as interrupted there and then, never re-run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnstile.activities.runs import as_current_run
from turnstile.activities.runtime import (
    Activities,
    WorkerShutdown,
    application_error,
    find_tool,
    turn_workflow_id,
    with_heartbeat,
)
from turnstile.engine.activity_io import EXECUTE_TOOL, ToolExecInput, ToolOutcome
from turnstile.engine.approvals import ran_call
from turnstile.engine.contract import AuditStatus, CallStatus
from turnstile.engine.errors import (
    CallNotRecorded,
    CallTakenOver,
    DatabaseUnavailable,
    MemoryConflictError,
    ResetConflict,
    RunSuperseded,
    ToolArgumentError,
)
from turnstile.engine.masking import mask_json_text
from turnstile.engine.messages import ToolCall
from turnstile.providers.function_model import raised_at
from turnstile.runtime.services import Service
from turnstile.runtime.tools import (
    Tool,
    ToolContext,
    ToolExecutionError,
    ToolInterrupted,
    ToolResult,
    result_to_text,
)
from turnstile.runtime.tracing import record_tool_outcome, tool_span
from turnstile.stores.call_key import CallKey
from turnstile.stores.db_errors import db_error_text, error_category
from turnstile.stores.journal import Ending, Start
from turnstile.stores.ledger import LedgerStatus
from turnstile.stores.transaction import Transaction

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


def offered(service: Service) -> frozenset[str]:
    """The tools a service offers: its own and its providers' catalogues."""
    return frozenset(service.tools.names()).union(
        *(p.catalogue.names() for p in service.providers))


def rerunnable(tool: Tool) -> bool:
    """May a call whose attempt vanished mid-run be run again?"""
    return tool.spec.idempotent or tool.spec.transactional


class ToolActivities(Activities):
    @activity.defn(name=EXECUTE_TOOL)
    async def execute_tool(self, req: ToolExecInput) -> ToolOutcome:
        try:
            with tool_span(req.call.name, req.call.id, activity.info().attempt) as span:
                # The claim and the record may wait on database locks: heartbeat
                # them too, not only the tool.
                outcome = await with_heartbeat(self._execute(req))
                record_tool_outcome(span, outcome.status, outcome.is_error)
                return outcome
        except (DatabaseUnavailable, MemoryConflictError, CallTakenOver,
                CallNotRecorded, ResetConflict, RunSuperseded) as exc:
            raise application_error(exc, non_retryable=isinstance(
                exc, MemoryConflictError | ResetConflict | RunSuperseded)) from exc

    async def _finish(self, req: ToolExecInput, text: str, status: CallStatus,
                      is_error: bool, state: dict[str, Any] | None = None, *,
                      audit: AuditStatus = AuditStatus.FAILED, error: str | None = None,
                      attempt: int | None = None,
                      tx: Transaction | None = None) -> ToolOutcome:
        """Record how the call ended — ledger (when `attempt` is this
        attempt's claim), audit row, approval decision, result message — in
        one transaction (turnstile.stores.journal): `tx` when the tool wrote
        its effect there."""
        try:
            await self._record(self._ending(req, text, status, is_error, state, audit=audit,
                                            error=error, attempt=attempt), tx)
        except (DatabaseUnavailable, MemoryConflictError, CallTakenOver, ResetConflict,
                RunSuperseded):
            raise
        except Exception as exc:
            category = error_category(exc)
            if category is None:
                raise
            # The driver's text (SQL, roles, hosts, the result itself) goes to
            # the log only, not into the failure and so the turn's history.
            log.warning("recording the end of call %s (%s) failed: %s", req.call.id,
                        req.call.name, exc)
            raise CallNotRecorded(f"recording the call failed: {category}") from None
        return ToolOutcome(call_id=req.call.id, name=req.call.name, status=status,
                           is_error=is_error, preview=_preview(text))

    @staticmethod
    def _ending(req: ToolExecInput, text: str, status: CallStatus, is_error: bool,
                state: dict[str, Any] | None, *, audit: AuditStatus, error: str | None,
                attempt: int | None) -> Ending:
        ran = ran_call(req.call, req.approval)  # approved with edits: the reviewer's arguments
        return Ending(
            workflow_id=turn_workflow_id(), chain=req.execution_chain,
            conversation_id=req.conversation_id, user_id=req.user_id, call=ran,
            model_call=req.call if ran is not req.call else None,
            seq=req.result_seq, outcome=status, text=text, is_error=is_error,
            audit_status=audit, audit_error=error, decision=req.approval, state=state,
            attempt=attempt, approval_reason=req.approval_reason, provenance=req.provenance)

    async def _record(self, ending: Ending, tx: Transaction | None) -> None:
        """The journal's `finish` as this activity's run (activities.runs): the
        result's slot is claimed in the same transaction."""
        if not ending.chain:
            await self.rt.db.call(self.rt.journal.finish, ending, tx)
            return
        try:
            await as_current_run(self.rt.db, ending.chain,
                                 lambda w: self.rt.journal.finish(ending, tx, w))
        except RunSuperseded:
            # A run a reset replaced. An effect the tool wrote in the journal's
            # transaction rolls back with it (never committed); one it caused
            # elsewhere is recorded (ledger, audit) so the reset run reuses it
            # instead of running the call again. Its memory is not this run's.
            if tx is None or not tx.used:
                await self.rt.db.call(self.rt.journal.landed, ending)
            raise

    async def _execute(self, req: ToolExecInput) -> ToolOutcome:
        call = ran_call(req.call, req.approval)  # checked again below, as the model's would be
        service = self.rt.services.get(req.service)
        tool = await find_tool(service, call.name, LISTING_HEARTBEAT_SECONDS)
        if tool is None:  # the workflow checks names first; a stale spec can still get here
            text = f"Tool {call.name!r} does not exist."
            return await self._finish(req, text, CallStatus.UNKNOWN_TOOL, True, error=text)
        try:
            args = tool.parse_arguments(call.arguments)
            tool.check_outbound(args, service.outbound)
        except ToolArgumentError as exc:
            return await self._finish(req, str(exc), CallStatus.INVALID_ARGUMENTS, True,
                                      error=str(exc))

        outcome = await self._claimed(req, tool, args, call)
        if outcome.status is CallStatus.COMPLETED and not outcome.is_error:
            # What the repeat breaker compares (turnstile.engine.equivalence).
            outcome.repeat_key = tool.repeat_key(args)
        return outcome

    async def _claimed(self, req: ToolExecInput, tool: Tool, args: BaseModel,
                       call: ToolCall) -> ToolOutcome:
        """Claim the validated call in the ledger and run it (or replay how it ended)."""
        wf_id, chain = turn_workflow_id(), req.execution_chain
        entry = await self.rt.db.call(
            self.rt.journal.begin, Start(workflow_id=wf_id, chain=chain,
                                         conversation_id=req.conversation_id,
                                         user_id=req.user_id, call=call,
                                         approval_reason=req.approval_reason,
                                         provenance=req.provenance),
            rerun_lost=rerunnable(tool))
        if entry.status is LedgerStatus.COMPLETED:
            # A finished attempt whose completion was lost: replay what it reported.
            status = entry.outcome or (
                CallStatus.FAILED if entry.is_error else CallStatus.COMPLETED)
            return await self._finish(
                req, entry.result or "", status, entry.is_error, entry.state,
                audit=AuditStatus.FAILED if entry.is_error else AuditStatus.COMPLETED,
                error=(entry.result or "")[:500] if entry.is_error else None)
        if not entry.fresh:
            return await self._interrupted(req, entry.attempts, "its worker was lost mid-run")
        tx = self.rt.journal.transaction()
        try:
            return await self._run(req, tool, args, entry.attempts, tx)
        finally:
            tx.release()  # rolls back whatever was not committed with the record

    async def _run(self, req: ToolExecInput, tool: Tool, args: BaseModel, claim: int,
                   tx: Transaction) -> ToolOutcome:
        """Run the claimed call (ledger claim `claim`); its writes go to `tx`."""
        info = activity.info()
        wf_id, call, chain = turn_workflow_id(), req.call, req.execution_chain
        ctx = ToolContext(
            db=self.rt.db, workflow_id=wf_id, conversation_id=req.conversation_id,
            user_id=req.user_id, tool_call_id=call.id, attempt=info.attempt,
            settings=self.rt.settings, heartbeat=activity.heartbeat, execution_chain=chain,
            statement_timeout_seconds=tool.spec.statement_timeout_seconds, journal_tx=tx,
            offered_tools=offered(self.rt.services.get(req.service)),
        )
        running = tool.start(ctx, args)
        try:
            # A thread is shielded from the cancel, which cannot stop it anyway:
            # its end is awaited below, not abandoned.
            work = asyncio.shield(running) if tool.runs_in_thread else running
            result = await with_heartbeat(work, tool.spec.heartbeat_seconds, hand_back=True)
        except asyncio.CancelledError:
            if tool.runs_in_thread:
                await self._landed_after_cancel(req, tool, running, claim, tx)
            raise
        except WorkerShutdown:
            tx.release()  # the tool's writes, if any, roll back (its thread's, once it ends)
            if rerunnable(tool):
                raise  # handed back: the ledger says STARTED, the next attempt runs it again
            return await self._interrupted(req, claim, "the worker shut down mid-run")
        except ToolInterrupted as exc:
            tx.release()
            if not rerunnable(tool):
                # In flight when the connection broke: the effect is unknown, so
                # the call is settled as interrupted, never re-run.
                return await self._interrupted(req, claim, str(exc))
            await self._attempt_failed(req, str(exc), claim)
            raise ApplicationError(str(exc), type="ToolExecutionError") from exc
        except ToolArgumentError as exc:
            # The tool's own validation (e.g. start after end): the model can fix it.
            tx.release()
            return await self._finish(req, str(exc), CallStatus.INVALID_ARGUMENTS, True,
                                      error=str(exc), attempt=claim)
        except Exception as exc:
            # Any other failure is an execution error: Temporal retries it per the tool's policy.
            tx.release()
            retryable = not (isinstance(exc, ToolExecutionError) and not exc.retryable)
            error = (str(exc) if isinstance(exc, ToolExecutionError)
                     else f"{type(exc).__name__}: {exc}")
            category = error_category(exc)
            if category is None and not isinstance(exc, ToolExecutionError):
                # The user's own code raised: the log names where (the innermost
                # frame outside turnstile/) and keeps the traceback.
                log.warning("tool %s (%s) attempt %d raised %s: %s at %s", call.name, call.id,
                            info.attempt, type(exc).__name__, exc,
                            raised_at(exc) or "(no frame outside turnstile)", exc_info=exc)
            if category is not None:
                # The driver's text names hosts, roles, SQL: the log gets it; the
                # ledger, audit, memory and the model get the category.
                log.warning("tool %s (%s) attempt %d failed: %s", call.name, call.id,
                            info.attempt, db_error_text(exc))
                error = f"{category}; tried {info.attempt} time(s)"
            await self._attempt_failed(req, error, claim)
            # A database error's driver text stays in the log (not the history).
            raise ApplicationError(error, type=ToolExecutionError.error_type,
                                   non_retryable=not retryable) from (
                None if category is not None else exc)
        text = result_to_text(result)
        state = result.state if isinstance(result, ToolResult) else None
        if isinstance(result, ToolResult) and result.is_error:
            # The tool ran and reported a failure: an error result for the model.
            return await self._finish(req, text, CallStatus.FAILED, True, state,
                                      error=text[:500], attempt=claim, tx=tx)
        return await self._finish(req, text, CallStatus.COMPLETED, False, state,
                                  audit=AuditStatus.COMPLETED, attempt=claim, tx=tx)

    async def _landed_after_cancel(self, req: ToolExecInput, tool: Tool,
                                   running: asyncio.Future[Any], claim: int,
                                   tx: Transaction) -> None:
        """The turn was cancelled while a tool's thread ran. The effect lands
        (or not) whatever the cancel says, and the cancel path undoes what the
        ledger says landed (activities.saga waits for this claim): so the
        thread is waited for, heartbeating, and what it did is recorded —
        ledger and audit, in the tool's transaction; memory gets the cancel
        path's words, then the undo's."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + tool.spec.start_to_close_seconds  # a hung thread: give up
        while not running.done():
            if loop.time() > deadline:
                log.warning("tool %s (%s) still runs %.0f s after the turn was cancelled: "
                            "its effect stays unknown", req.call.name, req.call.id,
                            tool.spec.start_to_close_seconds)
                return
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({running}, timeout=1.0)
            activity.heartbeat()
        if running.cancelled() or running.exception() is not None:
            tx.release()
            await self._attempt_failed(req, "cancelled with the turn; the tool then failed",
                                       claim)
            return
        result = running.result()
        if isinstance(result, ToolResult) and result.is_error:
            tx.release()
            await self._attempt_failed(req, result_to_text(result), claim)
            return
        state = result.state if isinstance(result, ToolResult) else None
        ending = self._ending(req, result_to_text(result), CallStatus.COMPLETED, False, state,
                              audit=AuditStatus.COMPLETED, error=None, attempt=claim)
        await self.rt.db.call(self.rt.journal.landed, ending, tx)
        log.info("tool %s (%s) ended after the turn was cancelled: its effect is recorded "
                 "for the undo", req.call.name, req.call.id)

    async def _attempt_failed(self, req: ToolExecInput, error: str, claim: int) -> None:
        """The attempt ended cleanly without a result: a retry may run it again."""
        key = CallKey(turn_workflow_id(), req.execution_chain, req.call.id)
        await self.rt.db.call(self.rt.journal.attempt_failed, key, error, claim)

    async def _interrupted(self, req: ToolExecInput, claim: int, error: str) -> ToolOutcome:
        text = INTERRUPTED_TEXT.format(name=req.call.name)
        return await self._finish(req, text, CallStatus.INTERRUPTED, True,
                                  error=f"interrupted; effect unknown: {error}", attempt=claim)
