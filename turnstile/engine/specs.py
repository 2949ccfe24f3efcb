"""Service and tool descriptions as data.

A worker turns its registered services into a `ServiceSpec` (activity
`begin_turn`); the workflow reads only this spec, so the policies that
steer a turn are recorded in its history and replay identically.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from turnstile.engine.approvals import ApprovalPolicy, OutboundPolicy
from turnstile.engine.breakers import BreakerPolicy
from turnstile.engine.flow import FlowRule
from turnstile.engine.memory_window import MemoryWindow
from turnstile.engine.model_settings import ModelSettings
from turnstile.engine.pipeline_spec import PipelineSpec

OnNewMessage = Literal["steer", "queue", "refuse"]
ON_NEW_MESSAGE: tuple[OnNewMessage, ...] = ("steer", "queue", "refuse")


def recorded(spec: BaseModel) -> dict[str, Any]:
    """A spec as history records it: the fields that differ from their
    defaults (a service's spec is mostly defaults). Reading it back fills
    the defaults of the code that reads it, so a default of these models is
    part of the turn's version (turnstile.engine.versions; pinned by
    tests/test_versions.py)."""
    return spec.model_dump(mode="json", exclude_defaults=True)


class RetrySpec(BaseModel):
    """Temporal retry policy of one tool's activity."""

    maximum_attempts: int = 3  # 0 = unlimited
    initial_interval_seconds: float = 1.0
    backoff_coefficient: float = 2.0
    maximum_interval_seconds: float = 30.0


DEFAULT_MAX_ARGUMENT_BYTES = 64 * 1024  # raw JSON arguments of one call


# Every statement a database tool runs is stopped after this long (per tool:
# ToolSpec.statement_timeout_seconds; turnstile.sales.access).
DEFAULT_STATEMENT_TIMEOUT_SECONDS = 3.0


# A lost worker is noticed within this long: every tool and compensation
# activity, and the model call, heartbeats with this heartbeat timeout by
# default. With the 1 s first retry interval a killed worker's call runs again
# within ~6 s (docs/design.md, "A lost worker costs seconds").
DEFAULT_HEARTBEAT_SECONDS = 5.0


class ToolSpec(BaseModel):
    DEFAULT_HEARTBEAT_SECONDS: ClassVar[float] = DEFAULT_HEARTBEAT_SECONDS

    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    idempotent: bool = False  # safe to run twice with the same call id
    # A second call with the same arguments (a new call id) is harmless and may
    # answer differently (a read, a status check): the repeat breaker
    # (turnstile.engine.repeats) lets it run. Left out of the serialized form
    # when False, so recorded specs read as before.
    repeatable: bool = Field(default=False, exclude_if=lambda v: not v)
    # Every effect of the tool is written through ToolContext.transaction(), so
    # it commits with the call's record or not at all: an attempt lost mid-run
    # left nothing, and the call is run again even if it is not idempotent.
    transactional: bool = False
    requires_approval: bool = False
    # The tool asks for approval only when its condition (`@tool(approval=...)`)
    # says so, given the validated arguments; evaluated in the review_call
    # activity. Left out of the serialized form when False, so recorded specs
    # read as before.
    approval_condition: bool = Field(default=False, exclude_if=lambda v: not v)
    fatal_on_failure: bool = False  # terminal failure means the task cannot be done
    compensation: str | None = None  # name of the compensation, if any
    start_to_close_seconds: float = 60.0
    # The activity's heartbeat timeout (None: the default).
    heartbeat_seconds: float | None = DEFAULT_HEARTBEAT_SECONDS
    retry: RetrySpec = Field(default_factory=RetrySpec)
    approval_timeout_seconds: float = 3600.0  # then the default policy rejects
    # The Web UI summary of the tool's activities (default: the tool's name),
    # e.g. "mcp time/get_current_time" for a tool of an MCP server.
    summary: str | None = None
    # What of a result the model is sent (None: the service's memory window
    # default, 16 KB); the full result stays in memory and the call ledger.
    max_result_bytes: int | None = None
    max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES  # larger arguments: argument error
    # Arguments a reviewer must see first (e.g. an e-mail's recipient and subject).
    review_fields: list[str] = Field(default_factory=list)
    # Arguments holding outbound addresses, checked against the service's OutboundPolicy.
    recipient_fields: list[str] = Field(default_factory=list)
    # The statement timeout of the tool's database statements.
    statement_timeout_seconds: float = DEFAULT_STATEMENT_TIMEOUT_SECONDS
    # Information flow (turnstile.engine.flow; docs/information-flow.md): the
    # rule for each argument whose value comes from untrusted content (the
    # tool's declaration, or the defaults of an effectful tool), and whether
    # the tool's own results are trusted. Left out of the serialized form when
    # empty/False, so recorded specs read as before; the workflow reads
    # `sensitive` only in turns begun at revision 7 or later.
    sensitive: dict[str, FlowRule] = Field(default_factory=dict, exclude_if=lambda v: not v)
    trusted_results: bool = Field(default=False, exclude_if=lambda v: not v)
    # Whole values of the tool's (JSON) results that are trusted: True, every
    # string and number in them (a directory listing); a list of keys, those
    # under these keys at any depth (a message's `sender`). A value is trusted
    # only as a whole, never the text inside it. Read by the review_call
    # activity only; left out of the serialized form when False/empty.
    trusted_values: bool | list[str] = Field(default=False, exclude_if=lambda v: not v)

    @property
    def start_to_close(self) -> timedelta:
        return timedelta(seconds=self.start_to_close_seconds)

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def policy(self) -> ToolSpec:
        """The tool as workflow code needs it: without what only the model
        request needs (description and argument schema, but for the names of
        the required arguments: a call without arguments is a dead end,
        turnstile.engine.dead_ends), so history does not carry them."""
        required = self.parameters.get("required")
        kept = {"required": list(required)} if isinstance(required, list) and required else {}
        return self.model_copy(update={"description": "", "parameters": kept})


class LoopPolicy(BaseModel):
    """How the tool round-trip loop reacts to the model (docs/design.md, "Tool calling")."""

    max_round_trips: int = 100
    on_unknown_tool: Literal["tell_model", "fail"] = "tell_model"
    on_invalid_arguments: Literal["tell_model", "fail"] = "tell_model"
    on_rejection: Literal["tell_model", "fail"] = "tell_model"  # a reviewer said no
    argument_error_budget: int = 3  # per tool per turn, then the turn fails
    model_timeout_seconds: float = 180.0  # one model request
    # The model activity heartbeats while it waits: a lost worker is noticed
    # within this long, not after model_timeout_seconds.
    model_heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    model_retry_window_seconds: float = 6 * 3600.0  # survive a provider outage this long
    compensation_attempts: int = 5  # each compensation's activity retries
    breakers: BreakerPolicy = Field(default_factory=BreakerPolicy)


class ServiceSpec(BaseModel):
    name: str
    description: str = ""
    system_prompt: str = ""  # template; {{variables}} allowed
    user_template: str = "{{message}}"
    tools: list[ToolSpec] = Field(default_factory=list)
    loop: LoopPolicy = Field(default_factory=LoopPolicy)
    dynamic_tools: bool = False  # ask the service's tool providers before each round
    search_attributes: bool = False  # the namespace has Turnstile's search attributes
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec)  # steps 2, 5-9, 11, 15-17
    # What of the stored conversation each model request carries (max_tokens
    # filled in by the worker for its model when the service leaves it unset).
    memory: MemoryWindow = Field(default_factory=MemoryWindow)
    approvals: ApprovalPolicy = Field(default_factory=ApprovalPolicy)  # who may decide
    outbound: OutboundPolicy = Field(default_factory=OutboundPolicy)  # where mail may go
    # A new turn while this service's turn of the conversation waits for an
    # approval (docs/steering.md): "queue" waits for the lock (visibly),
    # "steer" rejects the waiting calls and runs at once, "refuse" ends it.
    on_new_message: OnNewMessage = "queue"
    # What the model request asks besides the conversation: max_tokens,
    # temperature, tool_choice, the schema dialect, the compact prompt
    # (turnstile.engine.model_settings; docs/local-models.md).
    model: ModelSettings = Field(default_factory=ModelSettings)

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    def result_cap(self, tool_name: str) -> int:
        """Bytes of a tool's result sent to the model."""
        t = self.tool(tool_name)
        if t is not None and t.max_result_bytes is not None:
            return t.max_result_bytes
        return self.memory.tool_result_max_bytes
