"""Wire types of the pipeline's optional steps (2, 5, 7, 11, 15, 16): the
inputs and results of their activities. Re-exported by
turnstile.engine.activity_io, where their names and references live."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from turnstile.engine.events import TurnEventRecord


class TransformSystemInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    system_message: str  # rendered from the service's template
    variables: dict[str, Any] = Field(default_factory=dict)


class TransformedSystem(BaseModel):
    system_message: str


class Snippet(BaseModel):
    doc_id: str
    title: str
    text: str
    score: float = 0.0


class Retrieved(BaseModel):
    snippets: list[Snippet] = Field(default_factory=list)


class RetrieveInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    query: str  # the user message after its template
    raw_message: str
    top_k: int
    max_chars: int
    # Turn events delivered before retrieving (step 4's "turn started" rides
    # with step 5: no activity of its own).
    events: list[TurnEventRecord] = Field(default_factory=list)


class AttachmentMeta(BaseModel):
    """An attachment without its inline data (guardrails see this)."""

    type: str
    mime_type: str | None = None
    url: str | None = None
    chars: int = 0


class InputGuardrailsInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    message: str  # final user message (after retrieval)
    raw_message: str
    variables: dict[str, Any] = Field(default_factory=dict)
    attachments: list[AttachmentMeta] = Field(default_factory=list)


class OutputGuardrailsInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    answer: str
    user_message: str
    raw_message: str
    attempt: int = 0


class ModerateInput(BaseModel):
    conversation_id: str
    user_id: str
    service: str
    text: str
    raw_message: str


class ModerationResult(BaseModel):
    flagged: bool = False
    categories: list[str] = Field(default_factory=list)
    source: str = ""  # which moderator(s) answered


class ParseOutputInput(BaseModel):
    service: str
    answer: str


class ParsedOutput(BaseModel):
    ok: bool
    value: dict[str, Any] | None = None  # the typed answer as a JSON object
    error: str = ""


class DiscardInput(BaseModel):
    conversation_id: str
    seq: int
    reason: str
