"""Activity names, their input/output models, and typed references to them.

The activity names are part of running histories: changing one breaks every
turn in flight. Add new names; never rename. Workflow code schedules an
activity through its `ActivityRef` (bottom of this module), so the type
checker sees each activity's input and result; `tests/test_activity_refs.py`
checks every reference against the activity the worker registers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field, field_serializer

from turnstile.engine.contract import ApprovalDecision, AuditStatus, CallStatus, RollbackCause
from turnstile.engine.events import TurnEventRecord
from turnstile.engine.memory_window import MemoryWindow
from turnstile.engine.messages import ChatMessage, ToolCall, Usage

# The optional steps' wire types live in pipeline_io; imported from here too.
from turnstile.engine.pipeline_io import (
    AttachmentMeta as AttachmentMeta,
    DiscardInput as DiscardInput,
    InputGuardrailsInput as InputGuardrailsInput,
    ModerateInput as ModerateInput,
    ModerationResult as ModerationResult,
    OutputGuardrailsInput as OutputGuardrailsInput,
    ParsedOutput as ParsedOutput,
    ParseOutputInput as ParseOutputInput,
    RetrieveInput as RetrieveInput,
    TransformedSystem as TransformedSystem,
    TransformSystemInput as TransformSystemInput,
)
from turnstile.engine.pipeline_spec import GuardrailVerdict
from turnstile.engine.specs import ServiceSpec, ToolSpec

# Step 1 and the service's spec in one local activity (the turn's first
# bookkeeping; describe_service + load_memory before version 2 of the turn).
BEGIN_TURN = "turnstile.begin_turn"
# Version 1's opening activity: not registered any more (a worker refuses to
# start while such turns run); turnstile.engine.versions recognises it.
DESCRIBE_SERVICE = "turnstile.describe_service"
LOAD_MEMORY = "turnstile.load_memory"
APPEND_MESSAGES = "turnstile.append_messages"
CALL_MODEL = "turnstile.call_model"
EXECUTE_TOOL = "turnstile.execute_tool"
REVIEW_CALL = "turnstile.review_call"  # validate a call before a reviewer sees it
COMPENSATE_TOOL = "turnstile.compensate_tool"
RECORD_COMPENSATION_FAILURE = "turnstile.record_compensation_failure"
RESOLVE_TOOLS = "turnstile.resolve_tools"
RELEASE_CONVERSATION = "turnstile.release_conversation"
# The pipeline's optional steps (docs/pipeline.md); scheduled only when the
# service has the component, so a plain service's history is unchanged.
TRANSFORM_SYSTEM_MESSAGE = "turnstile.transform_system_message"  # step 2
RETRIEVE = "turnstile.retrieve"  # step 5
INPUT_GUARDRAILS = "turnstile.input_guardrails"  # step 7
MODERATE = "turnstile.moderate"  # step 11
OUTPUT_GUARDRAILS = "turnstile.output_guardrails"  # step 15
PARSE_OUTPUT = "turnstile.parse_output"  # step 16
DISCARD_MESSAGE = "turnstile.discard_message"  # step 15 retry / refused answers
PUBLISH_EVENT = "turnstile.publish_event"  # steps 4 and 17 (local activity)


def recorded(spec: BaseModel) -> dict[str, Any]:
    """A spec as history records it: the fields that differ from their
    defaults (a service's spec is mostly defaults). Reading it back fills
    the defaults of the code that reads it, so a default of these models is
    part of the turn's version (turnstile.engine.versions; pinned by
    tests/test_versions.py)."""
    return spec.model_dump(mode="json", exclude_defaults=True)


class LoadMemoryInput(BaseModel):
    conversation_id: str
    user_id: str
    # The turn's execution chain (see ToolExecInput): the conversation's lock
    # is held by the turn, so a reset run of it keeps the lock ("" in turns
    # recorded before reset runs were tracked: held by the run).
    execution_chain: str = ""
    # Release only: the first memory slot this run has not taken; what an
    # earlier run of the turn wrote from there on is superseded.
    next_seq: int | None = None
    # Release only: turn events delivered once the conversation is released
    # (the "turn completed" event rides with the release: no activity of its own).
    events: list[TurnEventRecord] = Field(default_factory=list)


class MemorySnapshot(BaseModel):
    """What the workflow needs to know about stored memory: where to write next.
    The conversation itself stays in the store."""

    next_seq: int
    message_count: int
    system_prompt: str | None = None  # latest stored system message
    # Tool calls of ended turns that had no result and got one at this load
    # (turnstile.stores.journal.repair_orphans): "call_id (tool): outcome".
    repaired: list[str] = Field(default_factory=list)


class Snippet(BaseModel):
    doc_id: str
    title: str
    text: str
    score: float = 0.0


class Retrieved(BaseModel):
    snippets: list[Snippet] = Field(default_factory=list)


class TurnOpening(BaseModel):
    """What `begin_turn` needs to run steps 4 and 5 itself once it holds the
    conversation (revision 2): the template variables the workflow renders
    the user message with (step 3), the raw message, and the "turn started"
    event to deliver before retrieving."""

    variables: dict[str, Any]
    raw_message: str
    events: list[TurnEventRecord] = Field(default_factory=list)


class BeginTurnInput(BaseModel):
    service: str  # "" names the worker's default service
    conversation_id: str
    user_id: str
    execution_chain: str = ""  # see LoadMemoryInput
    opening: TurnOpening | None = None  # from revision 2


class Opened(BaseModel):
    """Steps 4 and 5 as `begin_turn` ran them (revision 2). `retrieved` is
    None when it did not retrieve (no retriever, or the retriever failed or
    outlasted its budget there: step 5 then runs `turnstile.retrieve`, with
    its retries); `events_delivered`: step 4's event went out."""

    events_delivered: bool = False
    retrieved: Retrieved | None = None


class BeginTurnResult(BaseModel):
    """The service as this turn runs it, and where memory stands. The spec is
    the workflow's copy: loop policy, templates and flags, without tools:
    `tool_names` are the tools offered to the model, and a tool's policy
    (ToolSpec without description and schema) reaches the workflow with the
    first model response that calls it (ModelCallResult.tools). History
    carries the policies of the tools a turn uses, not of every tool."""

    spec: ServiceSpec
    tool_names: list[str]
    memory: MemorySnapshot | None  # None: the conversation is busy (`busy` says with what)
    busy: str | None = None
    # The worker's revision of the turn's version (turnstile.engine.versions):
    # the turn takes the commands of this revision. 0: recorded before revisions.
    revision: int = 0
    # None: steps 4 and 5 are the workflow's (busy, a system transformer, revision < 2).
    opened: Opened | None = None

    @field_serializer("spec")
    def _spec(self, spec: ServiceSpec) -> dict[str, Any]:
        return recorded(spec)


class AuditEntry(BaseModel):
    """A tool call the workflow settled without running it (unknown tool,
    rejection, disabled by a breaker, retries exhausted)."""

    call_id: str
    tool_name: str
    arguments: str
    status: AuditStatus
    error: str


class AppendMessagesInput(BaseModel):
    conversation_id: str
    user_id: str
    start_seq: int
    messages: list[ChatMessage]
    audit: list[AuditEntry] = Field(default_factory=list)
    decisions: list[ApprovalDecision] = Field(default_factory=list)
    # The turn's execution chain (see ToolExecInput).
    execution_chain: str = ""


class ModelCallInput(BaseModel):
    conversation_id: str
    execution_chain: str = ""  # the turn's execution chain (see ToolExecInput)
    service: str
    tool_names: list[str]
    response_seq: int  # where the assistant message is stored
    round: int
    taken_call_ids: list[str] = Field(default_factory=list)  # ids used earlier in the turn
    stream: bool = False  # step 8: stream partial text to `turn_stream`
    response_format: dict[str, Any] | None = None  # step 9: JSON schema for the provider
    # What of memory the request carries (the service spec's window, from
    # history; None in turns started before windows: the worker's current one).
    window: MemoryWindow | None = None
    # The previous answer hit the length limit: ask the model to go on (no
    # tools offered; the prompt is sent, never stored).
    continuation: bool = False
    # Messages the workflow wrote since the last model call (step 10's system
    # and user messages, a re-ask), stored at `prelude_seq`... before the
    # model is asked: the activity that needs them in memory writes them.
    prelude: list[ChatMessage] = Field(default_factory=list)
    prelude_seq: int = 0
    user_id: str = ""
    # Tools whose policy the workflow already has (see ModelCallResult.tools).
    known_policies: list[str] = Field(default_factory=list)


class ModelCallResult(BaseModel):
    message: ChatMessage
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""
    provider: str = ""
    # Policies (ToolSpec without description and schema) of the tools this
    # response calls that are not in ModelCallInput.known_policies.
    tools: list[ToolSpec] = Field(default_factory=list)

    @field_serializer("tools")
    def _tools(self, tools: list[ToolSpec]) -> list[dict[str, Any]]:
        return [recorded(t) for t in tools]


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


class ReviewCallInput(BaseModel):
    service: str
    call: ToolCall


class ReviewedCall(BaseModel):
    """A call checked before a reviewer is asked: valid (with notes for the
    reviewer), or the argument error the model gets instead. It carries no
    argument values: the workflow shows the call's own arguments, so this
    result adds no personal data to history."""

    valid: bool
    notes: list[str] = Field(default_factory=list)  # e.g. "external recipient: to at x.org"
    error: str = ""  # when not valid: what the model must fix


class ToolOutcome(BaseModel):
    call_id: str
    name: str
    status: CallStatus
    is_error: bool
    preview: str  # bounded; the full result is in memory


class CompensateInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    call: ToolCall
    cause: RollbackCause  # why the turn is rolled back
    # The turn's execution chain (workflow.info().first_execution_run_id; ""
    # in turns recorded before execution chains): scopes ledger, audit, idempotency and
    # approval keys, because provider call ids repeat.
    execution_chain: str = ""


class CompensateResult(BaseModel):
    call_id: str
    description: str
    undone: bool = True  # False: the effect could not be removed and remains


class CompensationFailure(BaseModel):
    conversation_id: str
    call: ToolCall
    cause: RollbackCause
    error: str
    # The turn's execution chain (workflow.info().first_execution_run_id; ""
    # in turns recorded before execution chains): scopes ledger, audit, idempotency and
    # approval keys, because provider call ids repeat.
    execution_chain: str = ""


class ResolveToolsInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    known: list[str]


class ResolvedTools(BaseModel):
    added: list[ToolSpec] = Field(default_factory=list)
    # Providers that could not be asked (an MCP server down after its retries):
    # their tools are missing from this round; the turn goes on without them.
    unavailable: list[str] = Field(default_factory=list)


# --- typed references: name, input and result of each activity ---------------
In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")


@dataclass(frozen=True)
class ActivityRef(Generic[In, Out]):
    """An activity as workflow code sees it: its registered name (a history
    contract), the model it takes and the type it returns."""

    name: str
    input_type: type[In]
    result_type: type[Out]


begin_turn = ActivityRef(BEGIN_TURN, BeginTurnInput, BeginTurnResult)
load_memory = ActivityRef(LOAD_MEMORY, LoadMemoryInput, MemorySnapshot)
append_messages = ActivityRef(APPEND_MESSAGES, AppendMessagesInput, type(None))
release_conversation = ActivityRef(RELEASE_CONVERSATION, LoadMemoryInput, type(None))
call_model = ActivityRef(CALL_MODEL, ModelCallInput, ModelCallResult)
execute_tool = ActivityRef(EXECUTE_TOOL, ToolExecInput, ToolOutcome)
review_call = ActivityRef(REVIEW_CALL, ReviewCallInput, ReviewedCall)
compensate_tool = ActivityRef(COMPENSATE_TOOL, CompensateInput, CompensateResult)
record_compensation_failure = ActivityRef(
    RECORD_COMPENSATION_FAILURE, CompensationFailure, type(None))
resolve_tools = ActivityRef(RESOLVE_TOOLS, ResolveToolsInput, ResolvedTools)
transform_system_message = ActivityRef(
    TRANSFORM_SYSTEM_MESSAGE, TransformSystemInput, TransformedSystem)
retrieve = ActivityRef(RETRIEVE, RetrieveInput, Retrieved)
input_guardrails = ActivityRef(INPUT_GUARDRAILS, InputGuardrailsInput, GuardrailVerdict)
moderate = ActivityRef(MODERATE, ModerateInput, ModerationResult)
output_guardrails = ActivityRef(OUTPUT_GUARDRAILS, OutputGuardrailsInput, GuardrailVerdict)
parse_output = ActivityRef(PARSE_OUTPUT, ParseOutputInput, ParsedOutput)
discard_message = ActivityRef(DISCARD_MESSAGE, DiscardInput, type(None))
