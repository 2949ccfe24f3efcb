"""The state of one turn, shared by the pipeline, the tool round and the saga.

Deterministic code only: it schedules activities and records what happened.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io, search_keys
    from turnstile.engine.contract import (
        ApprovalDecision,
        AuditStatus,
        CallStatus,
        PendingApproval,
        SteerSignal,
        ToolCallRecord,
        TurnEvent,
        TurnInput,
        TurnStatus,
    )
    from turnstile.engine.decision_payloads import REFUSAL_TEXT_MAX, REFUSALS_KEPT
    from turnstile.engine.errors import REFUSING_ERRORS, ResetConflict, TurnstileError
    from turnstile.engine.masking import mask_any, mask_json_text, mask_prefix
    from turnstile.engine.messages import ChatMessage, ToolCall, Usage
    from turnstile.engine.turn_machine import Moved, Phase, TurnMachine
    from turnstile.engine.turn_rules import parsed_arguments
    from turnstile.engine.versions import TURN_VERSION, Revision
    from turnstile.workflows import turn_metrics as metrics
    from turnstile.workflows.tool_options import (
        ActivityOptions,
        LocalActivityOptions,
        bookkeeping_options,
        memory_options,
    )

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")

MAX_EVENTS = 200


# Declared in turnstile.engine.search_keys (registered by the worker).
SA_STATUS = search_keys.STATUS
SA_PENDING = search_keys.PENDING_APPROVALS
SA_CONVERSATION = search_keys.CONVERSATION
SA_USER = search_keys.USER
SA_SERVICE = search_keys.SERVICE


def _cause(exc: ActivityError | ApplicationError) -> BaseException | None:
    # An activity fails with ActivityError (the attempt's error as its cause);
    # a local activity's failure arrives as the attempt's ApplicationError itself.
    return exc.cause if isinstance(exc, ActivityError) else exc


def failure_reason(exc: ActivityError | ApplicationError) -> str:
    """What an activity's last attempt reported, for the model and the turn's error."""
    cause = _cause(exc)
    return cause.message if isinstance(cause, ApplicationError) else str(cause or exc)


def failure_type(exc: ActivityError | ApplicationError) -> str:
    """The error type an activity's last attempt reported (its ApplicationError type)."""
    cause = _cause(exc)
    if isinstance(cause, ApplicationError):
        return cause.type or "ApplicationError"
    return type(cause or exc).__name__


# Arguments larger than this are not parsed into a call's record (any tool
# refuses them: ToolSpec.max_argument_bytes, 64 KiB by default); the record says
# how large they were. Workflow code has 2 s per activation.
RECORD_ARGUMENTS_LIMIT = 64 * 1024


def recorded_arguments(call: ToolCall) -> object:
    if len(call.arguments) > RECORD_ARGUMENTS_LIMIT:
        return {"omitted": f"{len(call.arguments)} characters of arguments"}
    return mask_any(parsed_arguments(call.arguments))


class TurnStopped(Exception):
    """Ends the turn with a status and a typed error (not a workflow failure).

    `error_type` is the error class's `error_type` (or, for an activity that
    failed, the type it reported). `answer` is what the user is told instead (a
    guardrail's or moderation's message); `compensate=False` keeps completed tool
    effects (an output guardrail's plain `fail` refuses the answer, not the work)."""

    def __init__(self, status: TurnStatus, error: TurnstileError, call_id: str | None = None,
                 *, answer: str | None = None, compensate: bool = True) -> None:
        super().__init__(str(error))
        self.status, self.error_type, self.call_id = status, error.error_type, call_id
        self.answer, self.compensate = answer, compensate
        # Set for an UnexpectedError (AgentTurn._unexpected): the step and the
        # escaped exception's class, carried into TurnErrorInfo.
        self.step: str | None = None
        self.exception: str | None = None

    @classmethod
    def from_activity(cls, status: TurnStatus,
                      exc: ActivityError | ApplicationError) -> TurnStopped:
        error_type = failure_type(exc)
        if error_type in REFUSING_ERRORS:  # the turn may not run: not a failure
            status = TurnStatus.REFUSED
        stop = cls(status, TurnstileError(failure_reason(exc)))
        stop.error_type = error_type
        # A refused reset changes nothing: the base run's effects stay.
        stop.compensate = stop.error_type != ResetConflict.error_type
        return stop


def ended_by(status: TurnStatus, exc: ActivityError | ApplicationError,
             cancel_path: bool) -> BaseException:
    """What an activity that did not complete does to the turn: one that failed
    for good stops it with `status`. One cancelled with the turn (`temporal
    workflow cancel` while it ran) is not a failure when `cancel_path`: the
    turn takes its cancel path and ends Canceled (AgentTurn.run), as a tool
    call does (ToolRound)."""
    if cancel_path and isinstance(exc, ActivityError) and isinstance(exc.cause, CancelledError):
        return asyncio.CancelledError()
    return TurnStopped.from_activity(status, exc)


class TurnState:
    def __init__(self) -> None:
        self.turn: TurnInput | None = None
        # The revision of the turn's version it was begun at (begin_turn's
        # record; turnstile.engine.versions): which commands this turn issues.
        self.revision = Revision()
        self.begun = False  # begin_turn has returned (and `revision` is the turn's)
        # The turn's phase, its pending calls, the decisions on them and the
        # steer: written only by the machine's transitions (read below).
        self.machine = TurnMachine(self.event)
        self.round_trips = 0
        self.calls: list[ToolCallRecord] = []
        self.events: list[TurnEvent] = []
        self.events_dropped = 0  # events trimmed off the front of `events`
        self.refused: list[str] = []
        self.refused_total = 0
        # Refused decisions, audited when the round or the turn ends.
        self.refusals: list[io.AuditEntry] = []
        self.usage = Usage()
        self.provider = ""
        self.seq = 0
        self.argument_errors: dict[str, int] = {}
        self.compensable: list[tuple[ToolCall, ToolCallRecord]] = []  # completion order
        self.tool_names: list[str] = []
        self.search_attributes = False
        self.answer_seq: int | None = None  # memory slot of the latest model response
        # The turn's execution chain (first_execution_run_id): see AgentTurn.run.
        self.chain = ""
        # Messages for memory that the next model call writes before it asks
        # (step 10, a re-ask): one write fewer per turn. `flush` writes what
        # is left when the turn ends without another model call.
        self.prelude: list[ChatMessage] = []
        self.prelude_seq = 0

    # -- the machine's state, read-only (turnstile.engine.turn_machine) ----------
    @property
    def step(self) -> Phase:
        return self.machine.phase

    @property
    def pending(self) -> Mapping[str, PendingApproval]:
        return self.machine.pending

    @property
    def decisions(self) -> Mapping[str, ApprovalDecision]:
        return self.machine.decisions

    @property
    def steered(self) -> SteerSignal | None:
        """A new turn of the user steered this one (workflows/steer_signal.py)."""
        return self.machine.steered

    @property
    def steered_calls(self) -> Sequence[str]:
        return self.machine.steered_calls

    @property
    def queued_behind(self) -> str:
        return self.machine.queued_behind

    async def enter(self, moved: Moved) -> None:
        """The search-attribute change a transition owes (one upsert), where
        the caller's history has it."""
        if moved.publishes:
            await self.publish()

    # -- records ---------------------------------------------------------------
    def new_call(self, call: ToolCall) -> ToolCallRecord:
        # Masked: the record reaches the status query, the result and history;
        # a reviewer sees the full arguments in `pending_approvals`.
        rec = ToolCallRecord(id=call.id, name=call.name, arguments=recorded_arguments(call),
                             round=self.round_trips)
        self.calls.append(rec)
        return rec

    def finish(self, rec: ToolCallRecord, status: CallStatus, preview: str) -> None:
        known = rec.name in self.tool_names
        metrics.tool_call(self.turn.service if self.turn else "", rec.name if known
                          else "(unknown)", status.value)
        rec.status = status
        rec.is_error = status not in (CallStatus.COMPLETED, CallStatus.PENDING)
        # Cut before masking (workflow code: bounded work), never through a value.
        rec.result_preview = (mask_json_text(preview) if len(preview) <= 4000
                              else mask_prefix(preview, 4000))[:400]
        self.event("tool_result", f"{rec.name}: {status.value}")

    def event(self, step: str, detail: str) -> None:
        self.events.append(TurnEvent(step=step, detail=detail))
        if len(self.events) > MAX_EVENTS:  # state only (no command): replay-safe
            self.events_dropped += len(self.events) - MAX_EVENTS
            del self.events[:-MAX_EVENTS]
        workflow.logger.info("%s: %s", step, detail)

    def refuse(self, call_id: str, tool_name: str, verb: str, reviewer: str,
               reason: str, *, queue: bool = True,
               details: dict[str, object] | None = None) -> io.AuditEntry:
        """A decision that is not applied: in the status query (the last
        REFUSALS_KEPT, texts cut, all counted), the log and the audit log —
        its entry, queued for the round's or the turn's end unless `queue`
        is False (the caller writes it at once)."""
        workflow.logger.warning(reason[:REFUSAL_TEXT_MAX])
        self.refused_total += 1
        self.refused.append(reason[:REFUSAL_TEXT_MAX])
        del self.refused[:-REFUSALS_KEPT]
        entry = io.AuditEntry(
            call_id=f"{call_id}/refused-{self.refused_total}", tool_name=tool_name or "(none)",
            arguments=json.dumps({"decision": verb, "reviewer": reviewer, **(details or {})}),
            status=AuditStatus.APPROVAL_REFUSED, error=reason[:REFUSAL_TEXT_MAX])
        if queue:
            self.refusals.append(entry)
        return entry

    def take_refusals(self) -> list[io.AuditEntry]:
        taken, self.refusals = self.refusals, []
        return taken

    def defer(self, messages: list[ChatMessage]) -> None:
        """Reserve slots for `messages`; the next model call stores them."""
        if not self.prelude:
            self.prelude_seq = self.seq
        elif self.prelude_seq + len(self.prelude) != self.seq:
            raise AssertionError("deferred messages must take consecutive memory slots")
        self.alloc(len(messages))
        self.prelude.extend(messages)

    def take_prelude(self) -> tuple[list[ChatMessage], int]:
        taken, self.prelude = self.prelude, []
        return taken, self.prelude_seq

    async def flush(self) -> None:
        """Store deferred messages no model call took (the turn ended first)."""
        messages, seq = self.take_prelude()
        if messages:
            await self.append(messages, seq=seq)

    def alloc(self, n: int) -> int:
        """Reserve `n` consecutive memory slots."""
        start, self.seq = self.seq, self.seq + n
        return start

    # -- activities shared by every part of the turn ---------------------------
    @staticmethod
    async def execute(ref: io.ActivityRef[In, Out], arg: In, summary: str,
                      options: ActivityOptions) -> Out:
        """Run an activity by its typed reference; ActivityError after its retries."""
        result: Out = await workflow.execute_activity(
            ref.name, arg, result_type=ref.result_type, summary=summary, **options)
        return result

    @staticmethod
    def start(ref: io.ActivityRef[In, Out], arg: In, summary: str,
              options: ActivityOptions) -> workflow.ActivityHandle[Out]:
        handle: workflow.ActivityHandle[Out] = workflow.start_activity(
            ref.name, arg, result_type=ref.result_type, summary=summary, **options)
        return handle

    async def activity(self, ref: io.ActivityRef[In, Out], arg: In, summary: str,
                       status_on_error: TurnStatus,
                       options: ActivityOptions | None = None) -> Out:
        """Run an activity; a failure after its retries ends the turn with its type."""
        try:
            return await self.execute(ref, arg, summary, options or memory_options())
        except ActivityError as exc:
            raise ended_by(status_on_error, exc, self.cancel_path()) from exc

    async def local(self, ref: io.ActivityRef[In, Out], arg: In, summary: str,
                    status_on_error: TurnStatus,
                    options: LocalActivityOptions | None = None) -> Out:
        """Run bookkeeping as a local activity; a failure after its retries
        ends the turn with its type."""
        try:
            result: Out = await workflow.execute_local_activity(
                ref.name, arg, result_type=ref.result_type, summary=summary,
                **(options or bookkeeping_options()))
            return result
        except (ActivityError, ApplicationError) as exc:
            raise ended_by(status_on_error, exc, self.cancel_path()) from exc

    def cancel_path(self) -> bool:
        """Does an activity cancelled with the turn send it down its cancel
        path? From revision 2; turns begun earlier ended such a cancel as a
        failure of the activity, and replay so. During begin_turn the revision
        is not known yet: this worker's rule applies (turnstile.engine.versions)."""
        return not self.begun or self.revision.cancel_ends_cancelled

    async def append(self, messages: list[ChatMessage], seq: int | None = None,
                     audit: list[io.AuditEntry] | None = None,
                     decisions: list[ApprovalDecision] | None = None) -> None:
        assert self.turn is not None
        start = self.alloc(len(messages)) if seq is None else seq
        await self.local(io.append_messages, io.AppendMessagesInput(
            conversation_id=self.turn.conversation_id, user_id=self.turn.user_id,
            start_seq=start, messages=messages, audit=audit or [], decisions=decisions or [],
            execution_chain=self.chain),
            "append_messages", TurnStatus.FAILED)

    async def publish(self) -> None:
        """Make the turn findable: search attributes when the namespace has them
        (`temporal workflow list --query 'TurnstilePendingApprovals > 0'`), else
        the memo. Issued for the machine's transitions that change them
        (`enter`; TRANSITIONS' `publishes`): one history event each."""
        if self.turn is None:
            return
        if self.search_attributes:
            workflow.upsert_search_attributes([
                SA_STATUS.value_set(self.step),
                SA_PENDING.value_set(len(self.pending)),
                SA_CONVERSATION.value_set(self.turn.conversation_id),
                SA_USER.value_set(self.turn.user_id),
                SA_SERVICE.value_set(self.turn.service),
            ])
            return
        workflow.upsert_memo({"turnstile_status": self.step,
                              "pending_approvals": len(self.pending),
                              "conversation_id": self.turn.conversation_id,
                              "turnstile_version": TURN_VERSION})
