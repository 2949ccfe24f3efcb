"""Services for the pipeline tests: the real components (full-text retriever,
guardrails, moderators) plus small recorders that remember what they saw."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, Field

from tests.support.services import make_service
from turnstile.engine.activity_io import ModerationResult
from turnstile.engine.pipeline_spec import PipelinePolicy
from turnstile.runtime.guardrails import (
    Guardrail,
    GuardrailContext,
    GuardrailResult,
    MaxLength,
    PiiGuardrail,
    prompt_injection_guardrail,
)
from turnstile.runtime.moderation import KeywordModerator, ModerationContext
from turnstile.runtime.services import Service
from turnstile.stores.retrieval_index import Document

DOCUMENTS = [
    Document("follow-up-policy", "Follow-up policy",
             "Key accounts get a personal follow-up call within two business days. "
             "Log every follow-up task with the customer id and the assignee."),
    Document("email-etiquette", "E-mail etiquette",
             "Keep follow-up e-mails short: a greeting, the reason, one clear next step. "
             "Never paste payment details into an e-mail."),
    Document("returns", "Returns",
             "Goods may be returned within thirty days with the original receipt."),
]


class Contact(BaseModel):
    name: str
    email: str
    priority: int = Field(ge=1, le=5)


@dataclass
class Recorder:
    """Wraps a guardrail (or nothing) and keeps every context it was given."""

    inner: Guardrail | None = None
    name: str = "recorder"
    seen: list[Any] = field(default_factory=list)

    def __call__(self, ctx: GuardrailContext) -> GuardrailResult:
        self.seen.append(ctx)
        return self.inner(ctx) if self.inner else GuardrailResult.passed()  # type: ignore[return-value]


@dataclass
class Scripted:
    """An output guardrail answering from a script, then passing."""

    results: list[GuardrailResult]
    name: str = "scripted"

    def __call__(self, ctx: GuardrailContext) -> GuardrailResult:
        return self.results.pop(0) if self.results else GuardrailResult.passed()


@dataclass
class SlowModerator:
    """The keyword moderator, answering after `seconds` (a remote one's latency)."""

    seconds: float = 1.5
    name: str = "slow_keywords"
    inner: KeywordModerator = field(default_factory=KeywordModerator)
    calls: list[str] = field(default_factory=list)

    async def __call__(self, ctx: ModerationContext) -> ModerationResult:
        self.calls.append(ctx.text)
        await asyncio.sleep(self.seconds)
        return self.inner(ctx)


def pipeline_service(name: str = "pipeline", *, policy: PipelinePolicy | None = None,
                     **components: Any) -> Service:
    """The test service (tools, {{team}} system prompt) with pipeline components."""
    if policy is not None:
        components["pipeline"] = policy
    return replace(make_service(name), **components)


def guarded_service(name: str = "guarded", recorder: Recorder | None = None,
                    **components: Any) -> Service:
    return pipeline_service(
        name, documents=DOCUMENTS,
        input_guardrails=[recorder or Recorder(), MaxLength(2000), PiiGuardrail(),
                          prompt_injection_guardrail()],
        **components)
