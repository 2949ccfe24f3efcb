"""Activity names and their input/output models.

The activity names are part of running histories: changing one breaks every
turn in flight. Add new names; never rename.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from turnstile.contract import ApprovalDecision
from turnstile.messages import ChatMessage, ToolCall, Usage
from turnstile.specs import ToolSpec

DESCRIBE_SERVICE = "turnstile.describe_service"
LOAD_MEMORY = "turnstile.load_memory"
APPEND_MESSAGES = "turnstile.append_messages"
CALL_MODEL = "turnstile.call_model"
EXECUTE_TOOL = "turnstile.execute_tool"
COMPENSATE_TOOL = "turnstile.compensate_tool"
RECORD_COMPENSATION_FAILURE = "turnstile.record_compensation_failure"
RESOLVE_TOOLS = "turnstile.resolve_tools"


class DescribeServiceInput(BaseModel):
    service: str


class LoadMemoryInput(BaseModel):
    conversation_id: str
    user_id: str


class MemorySnapshot(BaseModel):
    """What the workflow needs to know about stored memory: where to write next
    and a bounded preview. The conversation itself stays in the store."""

    next_seq: int
    message_count: int
    system_prompt: str | None = None  # latest stored system message
    preview: list[str] = Field(default_factory=list)  # last few, truncated


class AuditEntry(BaseModel):
    """A tool call the workflow settled without running it (unknown tool,
    rejection, disabled by a breaker, retries exhausted)."""

    call_id: str
    tool_name: str
    arguments: str
    status: str  # audit status: FAILED ...
    error: str


class AppendMessagesInput(BaseModel):
    conversation_id: str
    user_id: str
    start_seq: int
    messages: list[ChatMessage]
    audit: list[AuditEntry] = Field(default_factory=list)
    decisions: list[ApprovalDecision] = Field(default_factory=list)


class ModelCallInput(BaseModel):
    conversation_id: str
    service: str
    tool_names: list[str]
    response_seq: int  # where the assistant message is stored
    round: int
    taken_call_ids: list[str] = Field(default_factory=list)  # ids used earlier in the turn


class ModelCallResult(BaseModel):
    message: ChatMessage
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""
    provider: str = ""


class ToolExecInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    call: ToolCall
    result_seq: int  # where the tool-result message is stored
    approval: ApprovalDecision | None = None  # recorded with the execution


class ToolOutcome(BaseModel):
    call_id: str
    name: str
    status: str  # a turnstile.contract.CallStatus value
    is_error: bool
    preview: str  # bounded; the full result is in memory
    attributes: dict[str, Any] = Field(default_factory=dict)


class CompensateInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    call: ToolCall
    cause: dict[str, Any]  # {type, message, call_id, tool}: why the turn is rolled back


class CompensateResult(BaseModel):
    call_id: str
    description: str


class CompensationFailure(BaseModel):
    conversation_id: str
    call: ToolCall
    cause: dict[str, Any]
    error: str


class ResolveToolsInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    known: list[str]


class ResolvedTools(BaseModel):
    added: list[ToolSpec] = Field(default_factory=list)
