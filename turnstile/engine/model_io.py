"""Wire types of the model's activities: call_model and resolve_tools
(step 12's dynamic tools). Re-exported by turnstile.engine.activity_io,
where their names and references live."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_serializer

from turnstile.engine.memory_window import MemoryWindow
from turnstile.engine.messages import ChatMessage, Usage
from turnstile.engine.model_settings import ModelSettings
from turnstile.engine.specs import ToolSpec, recorded


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
    # With `continuation`: the prompt sent instead of the length-limit one (a
    # re-ask without tools: an empty answer's or a made-up result's,
    # turnstile.engine.answer_rules; a dead end's); sent, never stored.
    # Left out of the serialized form when empty.
    nudge: str = Field(default="", exclude_if=lambda v: not v)
    # Messages the workflow wrote since the last model call (step 10's system
    # and user messages, a re-ask), stored at `prelude_seq`... before the
    # model is asked: the activity that needs them in memory writes them.
    prelude: list[ChatMessage] = Field(default_factory=list)
    prelude_seq: int = 0
    user_id: str = ""
    # Tools whose policy the workflow already has (see ModelCallResult.tools).
    known_policies: list[str] = Field(default_factory=list)
    # The service spec's model settings, from history (None in turns whose
    # workflow did not pass them: the worker's current ones).
    model: ModelSettings | None = None

    @field_serializer("model")
    def _model(self, model: ModelSettings | None) -> dict[str, Any] | None:
        return None if model is None else recorded(model)  # its defaults are left out


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
