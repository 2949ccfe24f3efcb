"""`turnstile.client`: a typed async client for turns, for programs (a chat
API, a ticket system) and for `starter.py`.

    client = await TurnstileClient.connect()          # Settings.from_env()
    turn = await client.start_turn(TurnInput(conversation_id="c-1", user_id="alice",
                                             message="hello"))
    async for event in turn.events():                 # steps, tool calls, approvals, the end
        print(event.step, event.detail)
    result = await turn.result()                      # or a TurnEndedError

    for p in await client.pending_approvals(reviewer="bob"):
        decision = await client.review(p.workflow_id, p.tool_call_id, True, "bob", "ok",
                                       arguments_digest=p.arguments_digest)

It needs Temporal only: the database is reached only when a payload was
claim-checked into it (turnstile.stores.payload_store: above
TURNSTILE_PAYLOAD_THRESHOLD), through DATABASE_URL. Errors are typed:
`TurnNotFound`, `ApprovalRefused` (with the turn's reason) and its kind
`AlreadyDecided` (a reviewer name that is no identity — empty, refused by
RFC 8265, holding a lone surrogate — is refused by the turn and audited, as
every refused decision); a turn that ends without a result raises a
`TurnEndedError` (`TurnCancelledError`, `TurnTerminatedError`,
`TurnTimedOutError`, `TurnFailedError`: turnstile.turn_handle).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field
from pydantic_core import to_jsonable_python
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import RawValue, SearchAttributeKey
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from turnstile.approvals_listing import QUERY_TIMEOUT, ApprovalsListing
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApprovalDecision,
    Handlers,
    PendingApproval,
    ReviewInput,
    SimilarEffect,
    TurnInput,
    TurnResult,
)
from turnstile.engine.flow import ProvenanceSource
from turnstile.engine.identity import same_person
from turnstile.runtime.client import connect
from turnstile.runtime.config import Settings
from turnstile.stores.db import Database
from turnstile.stores.transcript import Transcript, read_transcript
from turnstile.turn_handle import (
    ClientError,
    TurnCancelledError,
    TurnEndedError,
    TurnFailedError,
    TurnHandle,
    TurnNotFound,
    TurnOutcome,
    TurnTerminatedError,
    TurnTimedOutError,
    not_found,
)

__all__ = ["AlreadyDecided", "ApprovalRefused", "Approvals", "ClientError",
           "PendingApprovalView", "TurnCancelledError", "TurnEndedError", "TurnFailedError",
           "TurnHandle", "TurnNotFound", "TurnOutcome", "TurnTerminatedError",
           "TurnTimedOutError", "TurnstileClient", "UnansweredTurn"]

log = logging.getLogger(__name__)

_CONVERSATION = SearchAttributeKey.for_keyword("TurnstileConversation")
_USER = SearchAttributeKey.for_keyword("TurnstileUser")
_SERVICE = SearchAttributeKey.for_keyword("TurnstileService")



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
    reason: str | None = None  # why it waits, for a tool that asks by condition
    # Earlier effects of the conversation that look alike (masked, newest first).
    similar_effects: list[SimilarEffect] = Field(default_factory=list)
    # Where the sensitive arguments' values came from (docs/information-flow.md).
    provenance: dict[str, list[ProvenanceSource]] = Field(default_factory=dict)


class UnansweredTurn(BaseModel):
    """A turn with pending approvals whose `pending_approvals` query did not
    answer (failed, or not within the timeout: e.g. its build's workers are
    gone). One row of the inbox, saying so."""

    workflow_id: str
    conversation_id: str = ""
    requester: str = ""
    service: str = ""
    reason: str


class Approvals(BaseModel):
    """`TurnstileClient.approvals()`: the calls waiting, and the turns that did not say."""

    pending: list[PendingApprovalView]
    unanswered: list[UnansweredTurn]


class TurnstileClient:
    def __init__(self, client: Client, settings: Settings,
                 query_timeout: timedelta = QUERY_TIMEOUT, *,
                 task_queue: str | None = None) -> None:
        """`task_queue`: where turns start (default: the settings',
        TURNSTILE_TASK_QUEUE) — your own worker's queue when it runs
        turnstile.TurnstilePlugin."""
        if task_queue is not None:
            settings = dataclasses.replace(settings, task_queue=task_queue)
        self.temporal, self.settings = client, settings
        self.query_timeout = query_timeout
        self._listing = ApprovalsListing(client, query_timeout)

    @classmethod
    async def connect(cls, settings: Settings | None = None, *,
                      task_queue: str | None = None) -> TurnstileClient:
        settings = settings or Settings.from_env()
        return cls(await connect(settings), settings, task_queue=task_queue)

    def turn(self, workflow_id: str) -> TurnHandle:
        """The turn of this workflow id (its latest run, followed across resets)."""
        return TurnHandle(self.temporal, workflow_id, database_url=self.settings.database_url)

    async def start_turn(self, turn: TurnInput, workflow_id: str | None = None) -> TurnHandle:
        import uuid

        wf_id = workflow_id or f"turn-{turn.conversation_id}-{uuid.uuid4().hex[:8]}"
        handle = await self.temporal.start_workflow(
            WORKFLOW_TYPE, turn, id=wf_id, task_queue=self.settings.task_queue,
            result_type=TurnResult)
        return TurnHandle(self.temporal, wf_id, handle.result_run_id,
                          self.settings.database_url)

    async def pending_approvals(self, reviewer: str | None = None,
                                service: str | None = None) -> list[PendingApprovalView]:
        """Calls waiting for a decision across running turns, newest first
        (`approvals().pending`: a turn that does not answer is left out)."""
        return (await self.approvals(reviewer, service)).pending

    async def approvals(self, reviewer: str | None = None,
                        service: str | None = None) -> Approvals:
        """Calls waiting for a decision across running turns, newest first: a
        visibility query on the turns' search attributes, then each turn's
        `pending_approvals` query, concurrently, each within `query_timeout`;
        a turn whose query fails or does not answer in time is one
        `UnansweredTurn` (turnstile.approvals_listing). With `reviewer`, their
        own calls (which they may not decide) are left out."""
        query = "TurnstilePendingApprovals > 0 AND ExecutionStatus = 'Running'"
        if service:
            query += f" AND TurnstileService = '{_quoted(service)}'"
        turns = [wf async for wf in self.temporal.list_workflows(query)]
        if reviewer is not None:
            turns = [wf for wf in turns
                     if not same_person(reviewer, wf.typed_search_attributes.get(_USER) or "")]
        answers = await self._listing.answers(turns, complete=not service)
        views: list[PendingApprovalView] = []
        unanswered: list[UnansweredTurn] = []
        for wf, answer in zip(turns, answers, strict=True):
            ids = _ids(wf)
            if isinstance(answer, str):
                unanswered.append(UnansweredTurn(workflow_id=wf.id, reason=answer, **ids))
            else:
                views += [PendingApprovalView(workflow_id=wf.id, **ids, **p.model_dump())
                          for p in answer]
        views.sort(key=lambda v: v.requested_at, reverse=True)
        return Approvals(pending=views, unanswered=unanswered)

    async def pending_approval(self, workflow_id: str,
                               tool_call_id: str) -> PendingApprovalView | None:
        """One call waiting for a decision, asked of its turn directly (not
        through visibility, which lags): None when it does not wait (or its
        turn does not answer within `query_timeout`)."""
        handle = self.temporal.get_workflow_handle(workflow_id)
        try:
            pending = await asyncio.wait_for(handle.query(
                Handlers.PENDING_APPROVALS, result_type=list[PendingApproval],
                rpc_timeout=self.query_timeout), self.query_timeout.total_seconds() * 2)
            attrs = (await handle.describe()).typed_search_attributes
        except (RPCError, WorkflowQueryFailedError, TimeoutError):
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
        self._listing.forget(workflow_id)
        try:
            decision: ApprovalDecision = await handle.execute_update(
                Handlers.REVIEW, review_payload(ReviewInput(
                    tool_call_id=tool_call_id, reviewer=reviewer, approved=approved, note=note,
                    arguments=arguments, arguments_digest=arguments_digest)),
                result_type=ApprovalDecision)
            return decision
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            reason = cause.message if isinstance(cause, ApplicationError) else str(cause or err)
            if "already decided" in reason:
                raise AlreadyDecided(reason) from err
            raise ApprovalRefused(reason) from err
        except RPCError as err:
            raise not_found(err, workflow_id) from err


    async def conversation(self, conversation_id: str) -> Transcript:
        """The conversation as memory holds it (`starter.py conversation show`):
        messages, calls with masked arguments, results with their marks,
        decisions and who made them. Read from the database of the settings."""
        s = self.settings
        db = Database(s.database_url, readonly_url=s.database_readonly_url)
        return await asyncio.to_thread(read_transcript, db, conversation_id)


def review_payload(review: ReviewInput) -> RawValue:
    """The `review` update's payload: its JSON with every character past
    ASCII escaped, so text no UTF-8 encoder takes (a lone surrogate, as a
    JSON escape or a command line's undecodable bytes carry it) reaches the
    turn as it was given, which refuses the decision and audits it
    (docs/identity.md), instead of failing here or arriving changed."""
    data = json.dumps(review.model_dump(), ensure_ascii=True, separators=(",", ":"),
                      default=to_jsonable_python)
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=data.encode("ascii")))


def _ids(wf: WorkflowExecution) -> dict[str, Any]:
    attrs = wf.typed_search_attributes
    return {"conversation_id": attrs.get(_CONVERSATION) or "",
            "requester": attrs.get(_USER) or "", "service": attrs.get(_SERVICE) or ""}


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
