"""The one small interface every model provider implements."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from turnstile.engine.messages import ChatMessage, Usage
from turnstile.engine.model_settings import SchemaDialect
from turnstile.engine.specs import ToolSpec


class ModelRequest(BaseModel):
    messages: list[ChatMessage]
    tools: list[ToolSpec] = Field(default_factory=list)
    response_format: dict[str, Any] | None = None
    # The service's ModelSettings as this request carries them (None: the
    # server's default; activities/model_request.py fills them in).
    max_tokens: int | None = None
    temperature: float | None = None
    # With tools: "auto", "required" or {"type": "function", "function": {"name": ...}}.
    tool_choice: str | dict[str, Any] = "auto"
    schema_dialect: SchemaDialect | None = None  # None: the provider's own
    # "text": tool calls and results rendered as text (ModelSettings.tool_results).
    tool_results: Literal["messages", "text"] = "messages"
    # ModelSettings.constrain_tool_calls: the tools as a response_format schema.
    constrain_tool_calls: bool = False
    # ModelSettings.parallel_tool_calls: False, at most one call per reply.
    parallel_tool_calls: bool = True


class ModelResponse(BaseModel):
    message: ChatMessage  # role "assistant": content and/or tool calls
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""


class ModelProvider(Protocol):
    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse: ...

    async def aclose(self) -> None: ...
