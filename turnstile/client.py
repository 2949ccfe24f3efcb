"""`turnstile.client`: a typed async client for turns, for programs (a chat
API, a ticket system) and for `starter.py`.

    client = await TurnstileClient.connect()          # Settings.from_env()
    turn = await client.start_turn(TurnInput(conversation_id="c-1", user_id="alice",
                                             message="hello"))
    async for event in turn.events():                 # steps, tool calls, approvals
        print(event.step, event.detail)
    result = await turn.result()

    for p in await client.pending_approvals(reviewer="bob"):
        decision = await client.review(p.workflow_id, p.tool_call_id, True, "bob", "ok")

It needs Temporal only: the database is reached only when a payload was
claim-checked into it (turnstile.stores.payload_store: above
TURNSTILE_PAYLOAD_THRESHOLD), through DATABASE_URL. Errors are typed:
`TurnNotFound`, `ApprovalRefused` (with the turn's reason) and its kind
`AlreadyDecided`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApprovalDecision,
    Handlers,
    PendingApproval,
    ReviewInput,
    TurnEvent,
    TurnInput,
    TurnProgress,
    TurnResult,
)
from turnstile.engine.identity import same_person
from turnstile.runtime.client import connect
from turnstile.runtime.config import Settings
from turnstile.stores.db import Database
from turnstile.stores.transcript import Transcript, read_transcript

__all__ = ["AlreadyDecided", "ApprovalRefused", "ClientError", "PendingApprovalView",
           "TurnHandle", "TurnNotFound", "TurnstileClient"]

_CONVERSATION = SearchAttributeKey.for_keyword("TurnstileConversation")
_USER = SearchAttributeKey.for_keyword("TurnstileUser")
_SERVICE = SearchAttributeKey.for_keyword("TurnstileService")


class ClientError(Exception):
    """Something the client was asked that the turns could not do."""


class TurnNotFound(ClientError):
    """No such turn, or it is no longer running (for what needs it running)."""


class ApprovalRefused(ClientError):
    """The `review` update refused the decision; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AlreadyDecided(ApprovalRefused):
    """Another decision on the call took effect first."""


class PendingApprovalView(BaseModel):
    """One call waiting for a reviewer, with the turn it belongs to."""

    workflow_id: str
    conversation_id: str = ""
    requester: str = ""
    service: str = ""
    tool_call_id: str
    tool_name: str
    arguments: Any
    highlights: dict[str, Any]
    notes: list[str]
    validated: bool
    requested_at: str
    arguments_digest: str = ""  # what a decision names (review(arguments_digest=...))
    deadline: str
    message: str | None = None  # the turn's user message (pending_approval only)


class TurnHandle:
    """One turn: its result, progress and events, and cancel."""

    def __init__(self, handle: WorkflowHandle[Any, TurnResult],
                 database_url: str | None = None) -> None:
        self._handle = handle
        self._database_url = database_url  # for streamed answer text (turn_stream)

    @property
    def id(self) -> str:
        return self._handle.id

    async def result(self) -> TurnResult:
        try:
            result: TurnResult = await self._handle.result()
            return result
        except RPCError as err:
            raise _not_found(err, self.id) from err

    async def status(self) -> TurnProgress:
        try:
            progress: TurnProgress = await self._handle.query(Handlers.STATUS,
                                                              result_type=TurnProgress)
            return progress
        except RPCError as err:
            raise _not_found(err, self.id) from err

    async def pending(self) -> list[PendingApproval]:
        """The calls of this turn waiting for a decision (the `pending_approvals` query)."""
        try:
            pending: list[PendingApproval] = await self._handle.query(
                Handlers.PENDING_APPROVALS, result_type=list[PendingApproval])
            return pending
        except RPCError as err:
            raise _not_found(err, self.id) from err

    async def cancel(self) -> None:
        """`temporal workflow cancel`: calls settled, effects undone, then Canceled."""
        try:
            await self._handle.cancel()
        except RPCError as err:
            raise _not_found(err, self.id) from err

    async def running(self) -> bool:
        try:
            return (await self._handle.describe()).status == WorkflowExecutionStatus.RUNNING
        except RPCError as err:
            raise _not_found(err, self.id) from err

    async def events(self, offset: int = 0, poll: float = 0.2,
                     text: bool = False) -> AsyncIterator[TurnEvent]:
        """The turn's events from `offset` on (step changes, tool calls, approvals
        awaited and decided, the end), as they happen; ends when the turn has
        ended and every event was given. Resume with the count already seen
        (the turn keeps its last 200 events). `text=True`: also the partial
        answer of a streaming service as it arrives, as `answer_text` events
        (read from the database's `turn_stream`, so this needs DATABASE_URL;
        they do not count toward `offset`)."""
        seen = offset
        position: tuple[int, int, int] = (-1, 0, -1)
        stream_db = None
        if text:
            from turnstile.stores.db import Database

            stream_db = Database(self._database_url or Settings.from_env().database_url)
        while True:
            alive = await self.running()
            if stream_db is not None:
                from turnstile.stores.streaming import read_stream

                rows = await asyncio.to_thread(read_stream, stream_db, self.id, position)
                for row in rows:
                    position = row.position
                    yield TurnEvent(step="answer_text", detail=row.text)
            try:
                progress = await self.status()
            except RPCError:  # no workflow task has run yet: nothing to say
                progress = None
            if progress is not None:
                for event in progress.events[seen:]:
                    yield event
                seen = max(seen, len(progress.events))
            if not alive:
                return
            await asyncio.sleep(poll)


class TurnstileClient:
    def __init__(self, client: Client, settings: Settings) -> None:
        self.temporal, self.settings = client, settings

    @classmethod
    async def connect(cls, settings: Settings | None = None) -> TurnstileClient:
        settings = settings or Settings.from_env()
        return cls(await connect(settings), settings)

    def turn(self, workflow_id: str) -> TurnHandle:
        return TurnHandle(self.temporal.get_workflow_handle(workflow_id, result_type=TurnResult),
                          self.settings.database_url)

    async def start_turn(self, turn: TurnInput, workflow_id: str | None = None) -> TurnHandle:
        import uuid

        wf_id = workflow_id or f"turn-{turn.conversation_id}-{uuid.uuid4().hex[:8]}"
        handle = await self.temporal.start_workflow(
            WORKFLOW_TYPE, turn, id=wf_id, task_queue=self.settings.task_queue,
            result_type=TurnResult)
        return TurnHandle(handle, self.settings.database_url)

    async def pending_approvals(self, reviewer: str | None = None,
                                service: str | None = None) -> list[PendingApprovalView]:
        """Calls waiting for a decision across running turns, newest first:
        a visibility query on the turns' search attributes, then each turn's
        `pending_approvals` query. With `reviewer`, their own calls (which they
        may not decide) are left out."""
        query = "TurnstilePendingApprovals > 0 AND ExecutionStatus = 'Running'"
        if service:
            query += f" AND TurnstileService = '{_quoted(service)}'"
        views: list[PendingApprovalView] = []
        async for wf in self.temporal.list_workflows(query):
            attrs = wf.typed_search_attributes
            try:
                pending = await self.temporal.get_workflow_handle(wf.id).query(
                    Handlers.PENDING_APPROVALS, result_type=list[PendingApproval])
            except RPCError:  # it ended meanwhile
                continue
            requester = attrs.get(_USER) or ""
            if reviewer is not None and same_person(reviewer, requester):
                continue
            views += [PendingApprovalView(
                workflow_id=wf.id, conversation_id=attrs.get(_CONVERSATION) or "",
                requester=requester, service=attrs.get(_SERVICE) or "",
                **p.model_dump()) for p in pending]
        views.sort(key=lambda v: v.requested_at, reverse=True)
        return views

    async def pending_approval(self, workflow_id: str,
                               tool_call_id: str) -> PendingApprovalView | None:
        """One call waiting for a decision, asked of its turn directly (not
        through visibility, which lags): None when it does not wait."""
        handle = self.temporal.get_workflow_handle(workflow_id)
        try:
            pending = await handle.query(Handlers.PENDING_APPROVALS,
                                         result_type=list[PendingApproval])
            attrs = (await handle.describe()).typed_search_attributes
        except RPCError:
            return None
        for p in pending:
            if p.tool_call_id == tool_call_id:
                return PendingApprovalView(
                    workflow_id=workflow_id, conversation_id=attrs.get(_CONVERSATION) or "",
                    requester=attrs.get(_USER) or "", service=attrs.get(_SERVICE) or "",
                    message=await self._user_message(handle), **p.model_dump())
        return None

    async def _user_message(self, handle: WorkflowHandle[Any, Any]) -> str | None:
        """The turn's message, from its input (the first event of its history)."""
        async for event in handle.fetch_history_events(page_size=1):
            started = event.workflow_execution_started_event_attributes
            values = await self.temporal.data_converter.decode(
                list(started.input.payloads), [TurnInput])
            turn = values[0] if values else None
            return turn.message if isinstance(turn, TurnInput) else None
        return None

    async def review(self, workflow_id: str, tool_call_id: str, approved: bool, reviewer: str,
                     note: str = "", *, arguments: dict[str, Any] | None = None,
                     arguments_digest: str | None = None) -> ApprovalDecision:
        """The decision that took effect, or ApprovalRefused / AlreadyDecided
        with the turn's reason, or TurnNotFound. `arguments`: the reviewer's
        complete edited arguments (approve with edits); `arguments_digest`:
        the pending call's digest the reviewer saw (refused as stale when the
        call changed since)."""
        handle = self.temporal.get_workflow_handle(workflow_id)
        try:
            decision: ApprovalDecision = await handle.execute_update(
                Handlers.REVIEW, ReviewInput(tool_call_id=tool_call_id, reviewer=reviewer,
                                             approved=approved, note=note, arguments=arguments,
                                             arguments_digest=arguments_digest),
                result_type=ApprovalDecision)
            return decision
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            reason = cause.message if isinstance(cause, ApplicationError) else str(cause or err)
            if "already decided" in reason:
                raise AlreadyDecided(reason) from err
            raise ApprovalRefused(reason) from err
        except RPCError as err:
            raise _not_found(err, workflow_id) from err


    async def conversation(self, conversation_id: str) -> Transcript:
        """The conversation as memory holds it (`starter.py conversation show`):
        messages, calls with masked arguments, results with their marks,
        decisions and who made them. Read from the database of the settings."""
        s = self.settings
        db = Database(s.database_url, readonly_url=s.database_readonly_url)
        return await asyncio.to_thread(read_transcript, db, conversation_id)


def _not_found(err: RPCError, workflow_id: str) -> Exception:
    if err.status == RPCStatusCode.NOT_FOUND or "already completed" in err.message:
        return TurnNotFound(f"turn {workflow_id!r} is not running or does not exist "
                            f"({err.message})")
    return err


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
