"""The public shapes of `AgentTurn` (docs/contract.md): input, result,
signals, queries and statuses. Fields may be added; none is ever renamed."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from turnstile.engine.flow import ProvenanceSource
from turnstile.engine.messages import Attachment, Usage

WORKFLOW_TYPE = "AgentTurn"
DEFAULT_TASK_QUEUE = "agent-turns"


class Handlers(StrEnum):
    """The names of AgentTurn's queries, signals and update: one spelling for
    the workflow, the client, the starter and the tests."""

    STATUS = "status"  # query -> TurnProgress
    PENDING_APPROVALS = "pending_approvals"  # query -> list[PendingApproval]
    APPROVE = "approve"  # signal ApproveSignal
    REJECT = "reject"  # signal RejectSignal
    REVIEW = "review"  # update ReviewInput -> ApprovalDecision
    # signal SteerSignal: a new turn of the conversation steers this one
    # (Service.on_new_message="steer"; docs/steering.md)
    STEER = "steer"


class TurnPhase(StrEnum):
    """Where a running turn is (`TurnProgress.step`, the `TurnstileStatus`
    search attribute); once it ends, the step is its TurnStatus value."""

    STARTING = "starting"
    # Another turn holds the conversation; `TurnProgress.queued_behind` says
    # which, and whether it waits for an approval (docs/steering.md).
    QUEUED = "queued"
    LOAD_MEMORY = "load_memory"
    PREPARE = "prepare"
    MODEL_CALL = "model_call"
    TOOLS = "tools"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPENSATING = "compensating"


class TurnInput(BaseModel):
    conversation_id: str = Field(min_length=1)
    user_id: str = Field(min_length=1)
    message: str
    # Empty: the worker's default service (the first it registers).
    service: str = ""
    variables: dict[str, Any] = Field(default_factory=dict)
    # Images for the user message (step 6): [{type: image_url|image_base64,
    # url|data, mime_type}]. Inline data is capped (PipelinePolicy).
    attachments: list[Attachment] = Field(default_factory=list)


class TurnStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    REFUSED = "refused"  # the turn was not allowed to run (e.g. foreign conversation)
    ROLLED_BACK = "rolled_back"
    COMPENSATION_FAILED = "compensation_failed"
    MODERATED = "moderated"  # moderation or the provider's content filter stopped the answer
    TRUNCATED = "truncated"  # the answer hit the output limit, continuation included
    # Cancelled (`temporal workflow cancel`): the workflow ends Canceled, so no
    # TurnResult carries it; the "turn completed" event and metrics do.
    CANCELLED = "cancelled"
    # A new message of the user steered the turn while it waited for an
    # approval (Service.on_new_message="steer"): its waiting calls were
    # rejected, and the new turn continues the conversation (docs/steering.md).
    STEERED = "steered"


class CallStatus(StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"  # executed and failed terminally; error went to the model
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    INTERRUPTED = "interrupted"  # lost mid-run, not safe to re-run
    REJECTED = "rejected"
    ROLLED_BACK = "rolled_back"
    # Not run: the same tool with identical arguments already succeeded in this
    # turn (the repeat breaker, turnstile.engine.repeats); the model is told what
    # it returned. Not an error: the effect the model asked for exists.
    REPEATED = "repeated"


class AuditStatus(StrEnum):
    """`tool_execution_log.status`."""

    INITIATED = "INITIATED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    ROLLED_BACK = "ROLLED_BACK"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    APPROVAL_REFUSED = "APPROVAL_REFUSED"  # a decision the approver policy did not apply
    # A call of a run a reset replaced whose effect remains (or may): the reset
    # run did not make it again (its own row beside the call's).
    SUPERSEDED = "SUPERSEDED"
    # A call a reviewer approved with edited arguments ran with them: the row
    # holds both versions, masked, and who edited (docs/approvals.md).
    APPROVED_WITH_EDITS = "APPROVED_WITH_EDITS"
    # A call the repeat breaker did not run: the same tool with identical
    # arguments had completed earlier in the turn (`error_message` names it).
    REPEATED = "REPEATED"
    # A call its information-flow rules refused (`@tool(sensitive=...)`, rule
    # `refuse`): an argument's value came from untrusted content; not run.
    # The row's `provenance` says where the value came from.
    FLOW_REFUSED = "FLOW_REFUSED"


class ToolCallRecord(BaseModel):
    id: str
    name: str
    arguments: Any  # parsed JSON object when it parses, else the raw text
    status: CallStatus = CallStatus.PENDING
    is_error: bool = False
    rolled_back: bool = False
    round: int = 0
    result_preview: str | None = None


class TurnErrorInfo(BaseModel):
    type: str  # the error class's `error_type` (turnstile.engine.errors) or the activity's
    message: str
    # Set for `UnexpectedError` only: the step (TurnPhase) the turn was in and
    # the class of the exception that escaped workflow code. Left out of the
    # serialized form when unset, so every other error reads as before.
    step: str | None = Field(default=None, exclude_if=lambda v: v is None)
    exception: str | None = Field(default=None, exclude_if=lambda v: v is None)


class RollbackCause(TurnErrorInfo):
    """Why completed calls are compensated: the turn's error and the call that
    failed, if one did (recorded on rolled-back tool results)."""

    call_id: str | None = None


class TurnResult(BaseModel):
    status: TurnStatus
    answer: Any = None
    round_trips: int = 0
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    error: TurnErrorInfo | None = None
    # additions beyond the contract's minimum
    workflow_id: str = ""
    conversation_id: str = ""
    service: str = ""
    provider: str = ""
    usage: Usage = Field(default_factory=Usage)


class TurnEvent(BaseModel):
    """One line of visible progress (status query, starter output)."""

    step: str
    detail: str = ""


class TurnProgress(BaseModel):
    """Answer of the `status` query."""

    step: str
    round_trips: int
    tool_calls: list[ToolCallRecord]
    pending_approvals: list[PendingApproval] = Field(default_factory=list)
    refused_signals: list[str] = Field(default_factory=list)  # the last 100, texts cut
    refused_signals_total: int = 0  # every refused decision, kept or not
    events: list[TurnEvent] = Field(default_factory=list)
    # While the step is `queued`: "queued behind turn X" (", waiting for an
    # approval" when X is parked on one); "" otherwise.
    queued_behind: str = ""
    # The absolute index of events[0]: the turn keeps its latest events only,
    # so a reader resumes by absolute offset (TurnHandle.events). 0 from a
    # worker before 0.4.
    events_offset: int = 0


# --- approvals ---------------------------------------------------------------
# A decision's `arguments` are the reviewer's COMPLETE edited arguments
# (approve with edits: validated again as the model's were); its
# `arguments_digest` is the `PendingApproval.arguments_digest` the reviewer
# saw (a decision naming another one is refused as stale). docs/approvals.md.
class ApproveSignal(BaseModel):
    tool_call_id: str
    reviewer: str
    comment: str = ""
    arguments: dict[str, Any] | None = None
    arguments_digest: str | None = None


class RejectSignal(BaseModel):
    tool_call_id: str
    reviewer: str
    reason: str = ""
    arguments_digest: str | None = None


class ReviewInput(BaseModel):
    """Input of the `review` update (programmatic clients): validated before
    it is accepted, unlike a signal."""

    tool_call_id: str
    reviewer: str
    approved: bool
    note: str = ""
    arguments: dict[str, Any] | None = None
    arguments_digest: str | None = None


class SteerSignal(BaseModel):
    """The `steer` signal: a new turn (`turn_id`) of the same user on the
    conversation arrived while this turn waits for an approval. Sent by the
    new turn's lock activity, repeatedly if need be: applying it twice changes
    nothing (docs/steering.md)."""

    turn_id: str
    user_id: str


class SimilarEffect(BaseModel):
    """An earlier call of the conversation that looks like the one waiting for
    a reviewer (same tool, a review field equal by the tool's equivalence, or
    the same effect): what a reviewer must know before approving another."""

    tool_name: str
    tool_call_id: str
    at: str  # when its result was recorded (ISO 8601, UTC)
    status: str  # its outcome (a CallStatus value: completed, interrupted, ...)
    arguments: Any  # masked (turnstile.engine.masking)
    this_turn: bool = False  # made by the turn that waits (else an earlier turn)
    same_effect: bool = False  # equal by meaning (the repeat breaker's key)


class PendingApproval(BaseModel):
    tool_call_id: str
    tool_name: str
    arguments: Any  # the full arguments; validated first when `validated`
    requested_at: str
    deadline: str
    # The fields that matter most (the tool's review_fields), shown first.
    highlights: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)  # e.g. "external recipient: to=..."
    validated: bool = False  # the arguments passed the tool's validation
    # sha256 hex of the arguments' canonical JSON
    # (turnstile.engine.approvals.arguments_digest); "" from a worker before 0.4.
    arguments_digest: str = ""
    # Why the call waits when its tool asks for approval by condition
    # (`@tool(approval=...)`): the condition's words. None: the tool always asks.
    reason: str | None = None
    # Earlier effects of the conversation that look alike (newest first; within
    # the service's `similar_effects_window_seconds`): docs/approvals.md.
    similar_effects: list[SimilarEffect] = Field(default_factory=list)
    # Where the values of the tool's sensitive arguments came from (argument
    # name -> sources: the user, or a tool's name and call id, ...;
    # turnstile.engine.flow, docs/information-flow.md). Empty for a tool
    # without sensitive arguments and in turns begun before revision 7.
    provenance: dict[str, list[ProvenanceSource]] = Field(default_factory=dict)


class ApprovalDecision(BaseModel):
    tool_call_id: str
    tool_name: str = ""
    approved: bool
    reviewer: str
    note: str = ""
    decided_at: str = ""
    # Approved with edits: the reviewer's complete arguments, which the tool runs with.
    arguments: dict[str, Any] | None = None


TurnProgress.model_rebuild()
