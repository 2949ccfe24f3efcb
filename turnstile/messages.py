"""Chat messages as stored in memory and sent to providers (OpenAI shape)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(BaseModel):
    """One tool call as the model emitted it. `arguments` stays the raw JSON text
    the model sent: parsing it is the tool's validation step, not transport's."""

    id: str
    name: str
    arguments: str = "{}"


class ChatMessage(BaseModel):
    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    is_error: bool = False
    # Cross-round state and provenance; names are a compatibility contract
    # (see turnstile.attributes).
    attributes: dict[str, Any] = Field(default_factory=dict)

    def preview(self, limit: int = 160) -> str:
        text = self.content or ""
        if self.tool_calls:
            text = text + " " + ", ".join(f"{c.name}({c.arguments})" for c in self.tool_calls)
        text = text.strip()
        return text if len(text) <= limit else text[: limit - 1] + "…"


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )
