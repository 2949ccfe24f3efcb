"""Wire types of the turn's bookkeeping: begin_turn (step 1 and the
service's spec), load_memory, append_messages and release_conversation.
Re-exported by turnstile.engine.activity_io, where their names and
references live."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_serializer

from turnstile.engine.contract import ApprovalDecision, AuditStatus
from turnstile.engine.events import TurnEventRecord
from turnstile.engine.flow import Provenance
from turnstile.engine.messages import ChatMessage
from turnstile.engine.pipeline_io import Retrieved
from turnstile.engine.specs import ServiceSpec, recorded


class LoadMemoryInput(BaseModel):
    conversation_id: str
    user_id: str
    # The turn's execution chain (see ToolExecInput): the conversation's lock
    # is held by the turn, so a reset run of it keeps the lock ("" in turns
    # recorded before reset runs were tracked: held by the run).
    execution_chain: str = ""
    # The turn's service's policy while the holder waits for an approval
    # (ServiceSpec.on_new_message; docs/steering.md). Absent: queue.
    on_new_message: str = "queue"


class ReleaseInput(BaseModel):
    """release_conversation: the turn's run lets the conversation go. Its
    JSON is the one the release sent when it shared LoadMemoryInput (the
    same field names), so a release scheduled by an older worker reads."""

    conversation_id: str
    user_id: str
    execution_chain: str = ""  # see LoadMemoryInput
    # The first memory slot this run has not taken; what an earlier run of
    # the turn wrote from there on is superseded.
    next_seq: int | None = None
    # Turn events delivered once the conversation is released (the "turn
    # completed" event rides with the release: no activity of its own).
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
    # The turn that waited for an approval and that this one steered to take
    # the conversation (on_new_message="steer"); "" when none.
    steered: str = ""


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
    # With `busy`: "queued behind turn X" (", waiting for an approval" when X
    # is parked on one) for the turn's status (docs/steering.md).
    queued_behind: str = ""
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
    # Why the call waited for a reviewer who then rejected it, or never
    # decided: a condition's words (`@tool(approval=...)`). Left out when None.
    approval_reason: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The provenance of the call's sensitive arguments (revision 7). Left out when None.
    provenance: Provenance | None = Field(default=None, exclude_if=lambda v: v is None)


class AppendMessagesInput(BaseModel):
    conversation_id: str
    user_id: str
    start_seq: int
    messages: list[ChatMessage]
    audit: list[AuditEntry] = Field(default_factory=list)
    decisions: list[ApprovalDecision] = Field(default_factory=list)
    # The turn's execution chain (see ToolExecInput).
    execution_chain: str = ""
