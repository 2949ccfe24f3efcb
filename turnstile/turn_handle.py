"""One turn as a program holds it (`TurnstileClient.start_turn` / `.turn`):
its result, its progress, its events, cancel — typed to the end.

Every way a turn's workflow can close has a typed answer:

- it returned: `result()` gives the `TurnResult` (status `completed`,
  `refused`, `failed`, `rolled_back`, `moderated`, ...);
- cancelled (`temporal workflow cancel`): `TurnCancelledError`;
- terminated: `TurnTerminatedError`;
- timed out (a workflow execution or run timeout): `TurnTimedOutError`;
- failed as a workflow (not a turn that ended `failed`, which returns):
  `TurnFailedError`.

Each is a `TurnEndedError` carrying the turn's last progress (`progress`:
its tool calls and events, from the `status` query; None when no worker
could answer it). `outcome()` gives the same as a `TurnOutcome` without
raising.

A handle follows the turn, not one run: after an operator's
`temporal workflow reset` the old run is terminated and a new run of the
same execution chain (the same `first_execution_run_id`) carries on;
`result()` then waits for that run. A new start of a closed workflow id is
another turn and is not followed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistoryEventFilterType,
    WorkflowQueryFailedError,
)
from temporalio.exceptions import CancelledError, TerminatedError, TimeoutError as WorkflowTimeout
from temporalio.service import RPCError

from turnstile.engine.contract import (
    Handlers,
    PendingApproval,
    TurnEvent,
    TurnProgress,
    TurnResult,
)
from turnstile.runtime.client import workflow_gone

__all__ = ["ClientError", "TurnCancelledError", "TurnEndedError", "TurnFailedError",
           "TurnHandle", "TurnNotFound", "TurnOutcome", "TurnTerminatedError",
           "TurnTimedOutError"]

# How long the status query of an ended turn may take (a worker replays it).
PROGRESS_TIMEOUT = timedelta(seconds=5)
# The step of the event that ends a turn's events (the workflow's own, or one
# the client gives for an ending the workflow could not record: terminated,
# timed out).
END_STEP = "turn_completed"


class ClientError(Exception):
    """Something the client was asked that the turns could not do."""


class TurnNotFound(ClientError):
    """No such turn, or it is no longer running (for what needs it running)."""


class TurnEndedError(ClientError):
    """The turn's workflow closed without a TurnResult. `status` names the
    ending (`cancelled`, `terminated`, `timed_out`, `failed`); `progress` is
    what the turn had done (None when no worker answered); `reason` is the
    server's or the workflow's message."""

    status = "ended"

    def __init__(self, workflow_id: str, reason: str,
                 progress: TurnProgress | None = None) -> None:
        super().__init__(f"turn {workflow_id!r} {self.status.replace('_', ' ')}: {reason}")
        self.workflow_id, self.reason, self.progress = workflow_id, reason, progress


class TurnCancelledError(TurnEndedError):
    status = "cancelled"


class TurnTerminatedError(TurnEndedError):
    status = "terminated"


class TurnTimedOutError(TurnEndedError):
    status = "timed_out"


class TurnFailedError(TurnEndedError):
    status = "failed"


class TurnOutcome(BaseModel):
    """How a turn ended, never raised: `status` is the TurnResult's status when
    the workflow returned one, else the ending's (`cancelled`, `terminated`,
    `timed_out`, `failed`)."""

    model_config = {"arbitrary_types_allowed": True}

    status: str
    result: TurnResult | None = None
    progress: TurnProgress | None = None
    reason: str = ""


def not_found(err: RPCError, workflow_id: str) -> Exception:
    if workflow_gone(err):
        return TurnNotFound(f"turn {workflow_id!r} is not running or does not exist "
                            f"({err.message})")
    return err


def _ending(failure: WorkflowFailureError) -> type[TurnEndedError]:
    cause = failure.cause
    if isinstance(cause, CancelledError):
        return TurnCancelledError
    if isinstance(cause, TerminatedError):
        return TurnTerminatedError
    if isinstance(cause, WorkflowTimeout):
        return TurnTimedOutError
    return TurnFailedError


class TurnHandle:
    """One turn: its result, progress and events, and cancel."""

    def __init__(self, client: Client, workflow_id: str, run_id: str | None = None,
                 database_url: str | None = None) -> None:
        self._client, self._id = client, workflow_id
        self._run_id = run_id  # the run followed now (None: the latest)
        self._chain: str | None = None  # first_execution_run_id, once known
        self._database_url = database_url  # for streamed answer text (turn_stream)

    @property
    def id(self) -> str:
        return self._id

    @property
    def run_id(self) -> str | None:
        """The run this handle follows now (after a reset: the reset run)."""
        return self._run_id

    def _handle(self) -> WorkflowHandle[Any, TurnResult]:
        return self._client.get_workflow_handle(self._id, run_id=self._run_id,
                                                result_type=TurnResult)

    async def _next_run(self) -> bool:
        """After the followed run was terminated: move to the run that replaced
        it in the same execution chain (a reset), if there is one."""
        latest = await self._client.get_workflow_handle(self._id).describe()
        info = latest.raw_description.workflow_execution_info
        if self._chain is None:
            mine = await self._client.get_workflow_handle(self._id,
                                                          run_id=self._run_id).describe()
            self._chain = mine.raw_description.workflow_execution_info.first_run_id
        if latest.run_id == self._run_id or info.first_run_id != self._chain:
            return False
        self._run_id = latest.run_id
        return True

    async def result(self) -> TurnResult:
        """The TurnResult, or the ending's TurnEndedError (see the module)."""
        while True:
            try:
                result: TurnResult = await self._handle().result()
                return result
            except RPCError as err:
                raise not_found(err, self.id) from err
            except WorkflowFailureError as failure:
                ending = _ending(failure)
                if self._run_id is None:
                    self._run_id = (await self._handle().describe()).run_id
                if ending is TurnTerminatedError and await self._next_run():
                    continue  # reset: the new run carries the turn on
                cause = failure.cause
                reason = str(cause.message if hasattr(cause, "message") else cause or failure)
                if ending is TurnTerminatedError:
                    reason = await self._termination_reason() or reason
                raise ending(self.id, reason, await self._last_progress()) from failure

    async def _termination_reason(self) -> str | None:
        """The operator's reason, from the run's close event (the SDK's error
        carries only a generic text)."""
        async for event in self._handle().fetch_history_events(
                event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT):
            reason = event.workflow_execution_terminated_event_attributes.reason
            return str(reason) or None
        return None

    async def outcome(self) -> TurnOutcome:
        """How the turn ended, as a value (waits for the end)."""
        try:
            result = await self.result()
        except TurnEndedError as ended:
            return TurnOutcome(status=ended.status, progress=ended.progress,
                               reason=ended.reason)
        return TurnOutcome(status=result.status.value, result=result)

    async def _last_progress(self) -> TurnProgress | None:
        try:
            return await asyncio.wait_for(self.status(), PROGRESS_TIMEOUT.total_seconds())
        except (RPCError, TurnNotFound, TimeoutError):
            return None

    async def status(self) -> TurnProgress:
        try:
            progress: TurnProgress = await self._handle().query(
                Handlers.STATUS, result_type=TurnProgress, rpc_timeout=PROGRESS_TIMEOUT)
            return progress
        except RPCError as err:
            raise not_found(err, self.id) from err

    async def pending(self) -> list[PendingApproval]:
        """The calls of this turn waiting for a decision (the `pending_approvals` query)."""
        try:
            pending: list[PendingApproval] = await self._handle().query(
                Handlers.PENDING_APPROVALS, result_type=list[PendingApproval])
            return pending
        except RPCError as err:
            raise not_found(err, self.id) from err

    async def cancel(self) -> None:
        """`temporal workflow cancel`: calls settled, effects undone, then Canceled."""
        try:
            await self._client.get_workflow_handle(self._id).cancel()
        except RPCError as err:
            raise not_found(err, self.id) from err

    async def _closed_as(self) -> WorkflowExecutionStatus | None:
        """None while the turn runs (its latest run), else how it closed."""
        try:
            latest = await self._client.get_workflow_handle(self._id).describe()
        except RPCError as err:
            raise not_found(err, self.id) from err
        if latest.status == WorkflowExecutionStatus.RUNNING:
            if self._run_id is not None and latest.run_id != self._run_id:
                await self._next_run()
            return None
        return latest.status

    async def running(self) -> bool:
        return await self._closed_as() is None

    async def events(self, offset: int = 0, poll: float = 0.2,
                     text: bool = False) -> AsyncIterator[TurnEvent]:
        """The turn's events from absolute `offset` on (step changes, tool
        calls, approvals awaited and decided), as they happen, and always its
        end: a `turn_completed` event, the workflow's own or — for an ending
        the workflow could not record (terminated, timed out) — one the client
        gives with the ending as its detail. Resume with the count already
        seen. The turn keeps its latest 200 events: a reader further behind
        gets one `events_missed` event saying how many it missed (it does not
        count toward the offset). `text=True`: also the partial answer of a
        streaming service as it arrives, as `answer_text` events (read from
        the database's `turn_stream`, so this needs DATABASE_URL; they do not
        count toward `offset`)."""
        seen = offset
        position: tuple[int, int, int] = (-1, 0, -1)
        stream_db = None
        if text:
            from turnstile.runtime.config import Settings
            from turnstile.stores.db import Database

            stream_db = Database(self._database_url or Settings.from_env().database_url)
        ended_with_event = False
        while True:
            closed = await self._closed_as()
            if stream_db is not None:
                from turnstile.stores.streaming import read_stream

                rows = await asyncio.to_thread(read_stream, stream_db, self.id, position)
                for row in rows:
                    position = row.position
                    yield TurnEvent(step="answer_text", detail=row.text)
            progress = await self._progress_or_none(closed is not None)
            if progress is not None:
                first = progress.events_offset
                if seen < first:
                    yield TurnEvent(step="events_missed",
                                    detail=f"{first - seen} event(s) no longer kept")
                    seen = first
                for event in progress.events[seen - first:]:
                    yield event
                seen = max(seen, first + len(progress.events))
                ended_with_event = bool(progress.events) and progress.events[-1].step == END_STEP
            if closed is not None:
                if not ended_with_event:
                    yield TurnEvent(step=END_STEP, detail=_closed_name(closed))
                return
            await asyncio.sleep(poll)

    async def _progress_or_none(self, closed: bool) -> TurnProgress | None:
        try:
            return await self.status()
        except (RPCError, TurnNotFound):
            # Running: no workflow task has run yet, nothing to say. Closed:
            # no worker answers for it any more; the end is still given.
            return None
        except WorkflowQueryFailedError:
            if closed:  # e.g. a closed turn a worker of another build cannot replay
                return None
            raise


def _closed_name(status: WorkflowExecutionStatus) -> str:
    return {WorkflowExecutionStatus.CANCELED: "cancelled",
            WorkflowExecutionStatus.TERMINATED: "terminated",
            WorkflowExecutionStatus.TIMED_OUT: "timed_out",
            WorkflowExecutionStatus.FAILED: "failed",
            WorkflowExecutionStatus.COMPLETED: "completed",
            WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued_as_new"}.get(status,
                                                                             status.name.lower())
