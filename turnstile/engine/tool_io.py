"""Wire types of the tools' activities: execute_tool, review_call and the
saga's compensate_tool and record_compensation_failure. Re-exported by
turnstile.engine.activity_io, where their names and references live."""

from __future__ import annotations

from pydantic import BaseModel, Field

from turnstile.engine.contract import ApprovalDecision, CallStatus, RollbackCause, SimilarEffect
from turnstile.engine.flow import FlowVerdict, Provenance
from turnstile.engine.messages import ToolCall


class ToolExecInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    call: ToolCall
    result_seq: int  # where the tool-result message is stored
    approval: ApprovalDecision | None = None  # recorded with the execution
    # The turn's execution chain (workflow.info().first_execution_run_id; ""
    # in turns recorded before execution chains): scopes ledger, audit, idempotency and
    # approval keys, because provider call ids repeat.
    execution_chain: str = ""
    # Why the call waited for the reviewer who approved it: a condition's words
    # (`@tool(approval=...)`, PendingApproval.reason), for its audit row. Left
    # out when None, so a turn without one sends what it always sent.
    approval_reason: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The provenance of the call's sensitive arguments (revision 7,
    # ReviewedCall.flow), for its audit row. Left out when None.
    provenance: Provenance | None = Field(default=None, exclude_if=lambda v: v is None)


class ReviewCallInput(BaseModel):
    service: str
    call: ToolCall
    # The turn's conversation: for a tool whose approval depends on what it
    # sees (ToolSpec.approval_condition), and from revision 5
    # (turnstile.engine.versions) the conversation whose earlier effects are
    # searched for ones that look alike (`similar`: the call may wait for a
    # reviewer); the user (the condition's ToolContext); the turn's workflow id
    # and chain (its own calls are marked `this_turn`). Left out at their defaults.
    conversation_id: str = Field(default="", exclude_if=lambda v: not v)
    user_id: str = Field(default="", exclude_if=lambda v: not v)
    similar: bool = Field(default=False, exclude_if=lambda v: not v)
    workflow_id: str = Field(default="", exclude_if=lambda v: not v)
    execution_chain: str = Field(default="", exclude_if=lambda v: not v)
    # From revision 7: derive the provenance of the tool's sensitive arguments
    # and the rule that applies (ReviewedCall.flow).
    flow: bool = Field(default=False, exclude_if=lambda v: not v)


class ReviewedCall(BaseModel):
    """A call checked before a reviewer is asked: valid (with notes for the
    reviewer), or the argument error the model gets instead. It carries no
    argument values: the workflow shows the call's own arguments, so this
    result adds no personal data to history."""

    valid: bool
    notes: list[str] = Field(default_factory=list)  # e.g. "external recipient: to at x.org"
    error: str = ""  # when not valid: what the model must fix
    # The tool's approval condition (ToolSpec.approval_condition) held: why a
    # reviewer must decide (masked, bounded). None: no condition, or it did
    # not hold, and the call runs at once. Recorded in the turn's history, so
    # a replay takes the same path whatever the condition would say now.
    reason: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The validated call's comparison key (turnstile.engine.equivalence; ""
    # for a repeatable tool and before revision 5): what the repeat breaker compares.
    repeat_key: str = Field(default="", exclude_if=lambda v: not v)
    # Earlier effects of the conversation that look alike, masked (when asked).
    similar_effects: list[SimilarEffect] = Field(default_factory=list,
                                                 exclude_if=lambda v: not v)
    # The information-flow verdict (when asked, `ReviewCallInput.flow`): the
    # rule that applies and the provenance of the sensitive arguments, masked.
    flow: FlowVerdict | None = Field(default=None, exclude_if=lambda v: v is None)


class ToolOutcome(BaseModel):
    call_id: str
    name: str
    status: CallStatus
    is_error: bool
    preview: str  # bounded; the full result is in memory
    # The comparison key of the validated arguments the call ran with
    # (turnstile.engine.equivalence): a completed call's, "" otherwise.
    repeat_key: str = Field(default="", exclude_if=lambda v: not v)


class CompensateInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    call: ToolCall
    cause: RollbackCause  # why the turn is rolled back
    execution_chain: str = ""  # the turn's execution chain (see ToolExecInput)


class CompensateResult(BaseModel):
    call_id: str
    description: str
    undone: bool = True  # False: the effect could not be removed and remains


class CompensationFailure(BaseModel):
    conversation_id: str
    call: ToolCall
    cause: RollbackCause
    error: str
    execution_chain: str = ""  # the turn's execution chain (see ToolExecInput)
