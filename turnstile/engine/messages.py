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


class Attachment(BaseModel):
    """A multimodal part of a user message (docs/pipeline.md, step 6).

    `image_url` carries `url` (https:// or data:); `image_base64` carries
    `data` (base64, no data: prefix) and `mime_type`. Checked by the pipeline
    (step 6), not here: a validator on workflow input would fail the workflow
    task forever instead of ending the turn with a clear error."""

    type: str = "image_url"  # image_url | image_base64 (any other value: step 6 refuses it)
    url: str | None = None
    data: str | None = None
    mime_type: str | None = None

    def inline_chars(self) -> int:
        """Characters of inline data this part puts into payloads."""
        inline_url = self.url if self.url and self.url.startswith("data:") else ""
        return len(self.data or "") + len(inline_url)

    def as_url(self) -> str:
        """The OpenAI `image_url.url` value: the URL, or a data: URL."""
        if self.type == "image_base64":
            return f"data:{self.mime_type or 'application/octet-stream'};base64,{self.data or ''}"
        return self.url or ""


class ChatMessage(BaseModel):
    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    is_error: bool = False
    # Cross-round state and provenance; names are a compatibility contract
    # (see turnstile.engine.attributes).
    attributes: dict[str, Any] = Field(default_factory=dict)
    # Multimodal parts of a user message, sent as OpenAI content parts after
    # the text (stored in `chat_message_part`, not in `chat_message`).
    parts: list[Attachment] = Field(default_factory=list)


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )
