"""Activity names, their input/output models, and typed references to them.

The activity names are part of running histories: changing one breaks every
turn in flight. Add new names; never rename. Workflow code schedules an
activity through its `ActivityRef` (below), so the type checker sees each
activity's input and result; `tests/test_activity_refs.py` checks every
reference against the activity the worker registers.

The wire types live by family (memory_io: the turn's bookkeeping; model_io;
tool_io; pipeline_io: the optional steps) and are re-exported here, so
`from turnstile.engine import activity_io as io; io.X` names every one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from turnstile.engine.memory_io import (
    AppendMessagesInput as AppendMessagesInput,
    AuditEntry as AuditEntry,
    BeginTurnInput as BeginTurnInput,
    BeginTurnResult as BeginTurnResult,
    LoadMemoryInput as LoadMemoryInput,
    MemorySnapshot as MemorySnapshot,
    Opened as Opened,
    ReleaseInput as ReleaseInput,
    TurnOpening as TurnOpening,
)
from turnstile.engine.model_io import (
    ModelCallInput as ModelCallInput,
    ModelCallResult as ModelCallResult,
    ResolvedTools as ResolvedTools,
    ResolveToolsInput as ResolveToolsInput,
)
from turnstile.engine.pipeline_io import (
    AttachmentMeta as AttachmentMeta,
    DiscardInput as DiscardInput,
    InputGuardrailsInput as InputGuardrailsInput,
    ModerateInput as ModerateInput,
    ModerationResult as ModerationResult,
    OutputGuardrailsInput as OutputGuardrailsInput,
    ParsedOutput as ParsedOutput,
    ParseOutputInput as ParseOutputInput,
    Retrieved as Retrieved,
    RetrieveInput as RetrieveInput,
    Snippet as Snippet,
    TransformedSystem as TransformedSystem,
    TransformSystemInput as TransformSystemInput,
)
from turnstile.engine.pipeline_spec import GuardrailVerdict
from turnstile.engine.specs import recorded as recorded
from turnstile.engine.tool_io import (
    ClaimGrantInput as ClaimGrantInput,
    CompensateInput as CompensateInput,
    CompensateResult as CompensateResult,
    CompensationFailure as CompensationFailure,
    GrantClaim as GrantClaim,
    IssuedGrant as IssuedGrant,
    IssueGrantInput as IssueGrantInput,
    ReviewCallInput as ReviewCallInput,
    ReviewedCall as ReviewedCall,
    RevokeGrantInput as RevokeGrantInput,
    ToolExecInput as ToolExecInput,
    ToolOutcome as ToolOutcome,
)

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")


@dataclass(frozen=True)
class ActivityRef(Generic[In, Out]):
    """An activity as workflow code sees it: its registered name (a history
    contract), the model it takes and the type it returns."""

    name: str
    input_type: type[In]
    result_type: type[Out]


# --- the turn's bookkeeping (local activities but load_memory) ---------------
# Step 1 and the service's spec in one local activity (the turn's first
# bookkeeping; describe_service + load_memory before version 2 of the turn).
BEGIN_TURN = "turnstile.begin_turn"
begin_turn = ActivityRef(BEGIN_TURN, BeginTurnInput, BeginTurnResult)
# Version 1's opening activity: not registered any more (a worker refuses to
# start while such turns run); turnstile.engine.versions recognises it.
DESCRIBE_SERVICE = "turnstile.describe_service"
LOAD_MEMORY = "turnstile.load_memory"
load_memory = ActivityRef(LOAD_MEMORY, LoadMemoryInput, MemorySnapshot)
APPEND_MESSAGES = "turnstile.append_messages"
append_messages = ActivityRef(APPEND_MESSAGES, AppendMessagesInput, type(None))
RELEASE_CONVERSATION = "turnstile.release_conversation"
release_conversation = ActivityRef(RELEASE_CONVERSATION, ReleaseInput, type(None))

# --- the model --------------------------------------------------------------
CALL_MODEL = "turnstile.call_model"
call_model = ActivityRef(CALL_MODEL, ModelCallInput, ModelCallResult)
RESOLVE_TOOLS = "turnstile.resolve_tools"
resolve_tools = ActivityRef(RESOLVE_TOOLS, ResolveToolsInput, ResolvedTools)

# --- tools and the saga -------------------------------------------------------
EXECUTE_TOOL = "turnstile.execute_tool"
execute_tool = ActivityRef(EXECUTE_TOOL, ToolExecInput, ToolOutcome)
REVIEW_CALL = "turnstile.review_call"  # validate a call before a reviewer sees it
review_call = ActivityRef(REVIEW_CALL, ReviewCallInput, ReviewedCall)
# Standing approvals (revision 8; docs/approvals.md): claim a grant that
# covers a call before it would wait; issue the grant a reviewer's approval
# carries; revoke one the turn issued for a decision that lost its race.
CLAIM_GRANT = "turnstile.claim_grant"
claim_grant = ActivityRef(CLAIM_GRANT, ClaimGrantInput, GrantClaim)
ISSUE_GRANT = "turnstile.issue_grant"
issue_grant = ActivityRef(ISSUE_GRANT, IssueGrantInput, IssuedGrant)
REVOKE_GRANT = "turnstile.revoke_grant"
revoke_grant = ActivityRef(REVOKE_GRANT, RevokeGrantInput, type(None))
COMPENSATE_TOOL = "turnstile.compensate_tool"
compensate_tool = ActivityRef(COMPENSATE_TOOL, CompensateInput, CompensateResult)
RECORD_COMPENSATION_FAILURE = "turnstile.record_compensation_failure"
record_compensation_failure = ActivityRef(
    RECORD_COMPENSATION_FAILURE, CompensationFailure, type(None))

# --- the pipeline's optional steps (docs/pipeline.md) -------------------------
# Scheduled only when the service has the component, so a plain service's
# history is unchanged.
TRANSFORM_SYSTEM_MESSAGE = "turnstile.transform_system_message"  # step 2
transform_system_message = ActivityRef(
    TRANSFORM_SYSTEM_MESSAGE, TransformSystemInput, TransformedSystem)
RETRIEVE = "turnstile.retrieve"  # step 5
retrieve = ActivityRef(RETRIEVE, RetrieveInput, Retrieved)
INPUT_GUARDRAILS = "turnstile.input_guardrails"  # step 7
input_guardrails = ActivityRef(INPUT_GUARDRAILS, InputGuardrailsInput, GuardrailVerdict)
MODERATE = "turnstile.moderate"  # step 11
moderate = ActivityRef(MODERATE, ModerateInput, ModerationResult)
OUTPUT_GUARDRAILS = "turnstile.output_guardrails"  # step 15
output_guardrails = ActivityRef(OUTPUT_GUARDRAILS, OutputGuardrailsInput, GuardrailVerdict)
PARSE_OUTPUT = "turnstile.parse_output"  # step 16
parse_output = ActivityRef(PARSE_OUTPUT, ParseOutputInput, ParsedOutput)
DISCARD_MESSAGE = "turnstile.discard_message"  # step 15 retry / refused answers
discard_message = ActivityRef(DISCARD_MESSAGE, DiscardInput, type(None))
# Steps 4 and 17 (a local activity started without a reference: its input
# is the event itself).
PUBLISH_EVENT = "turnstile.publish_event"
