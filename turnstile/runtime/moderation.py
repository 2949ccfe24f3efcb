"""Moderation (step 11): a service callable run in the `turnstile.moderate`
activity, started together with the first model request and checked before
the answer is returned.

- `KeywordModerator`: regular expressions per category, no network.
- `OpenAIModerator`: an OpenAI-compatible `POST {base}/moderations`; the base
  URL is its own or the worker's LLM_BASE_URL; without either it abstains.
- `AnyModerator`: several moderators, flagged if any flags.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from turnstile.engine.activity_io import ModerationResult
from turnstile.engine.callables import invoke
from turnstile.engine.errors import ModerationUnavailable


@dataclass(frozen=True)
class ModerationContext:
    conversation_id: str
    user_id: str
    service: str
    text: str  # the final user message, as the model receives it
    raw_message: str  # the user's own words
    settings: Any = None  # the worker's turnstile.runtime.config.Settings


Moderator = Callable[[ModerationContext], "ModerationResult | Awaitable[ModerationResult]"]

DEFAULT_CATEGORIES: dict[str, tuple[str, ...]] = {
    "violence": (
        r"\b(kill|murder|shoot|stab|behead)\s+(him|her|them|you|people|everyone|my\s+\w+)\b",
        r"\bhow\s+(do\s+i|to)\s+(make|build)\s+(a\s+)?(bomb|explosive|pipe\s*bomb)\b",
    ),
    "self-harm": (
        r"\b(kill|hurt|harm)\s+myself\b",
        r"\bwant\s+to\s+die\b",
    ),
    "harassment": (
        r"\b(threaten|blackmail|dox)\s+(him|her|them|the\s+customer|customers)\b",
    ),
}


@dataclass
class KeywordModerator:
    categories: Mapping[str, Sequence[str]] = field(default_factory=lambda: DEFAULT_CATEGORIES)
    name: str = "keywords"

    def __post_init__(self) -> None:
        self._compiled = {c: [re.compile(p, re.IGNORECASE) for p in ps]
                          for c, ps in self.categories.items()}

    def __call__(self, ctx: ModerationContext) -> ModerationResult:
        hits = [c for c, ps in self._compiled.items() if any(p.search(ctx.text) for p in ps)]
        return ModerationResult(flagged=bool(hits), categories=hits, source=self.name)


class OpenAIModerator:
    """OpenAI-compatible moderation endpoint. Temporal owns retries: this
    client never retries; 429/5xx/network are retryable, other 4xx are not."""

    name = "openai"

    def __init__(self, base_url: str | None = None, *, api_key: str | None = None,
                 model: str | None = None, timeout_seconds: float = 30.0) -> None:
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self.timeout = timeout_seconds

    async def __call__(self, ctx: ModerationContext) -> ModerationResult:
        settings = ctx.settings
        base = self.base_url or getattr(settings, "llm_base_url", None)
        if not base:
            return ModerationResult(source="openai: not configured (no LLM_BASE_URL)")
        key = self.api_key or getattr(settings, "llm_api_key", None)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body: dict[str, Any] = {"input": ctx.text}
        if self.model:
            body["model"] = self.model
        url = f"{base.rstrip('/')}/moderations"
        try:
            async with httpx.AsyncClient(timeout=self.timeout, headers=headers) as client:
                resp = await client.post(url, json=body)
        except httpx.TransportError as exc:
            raise ModerationUnavailable(f"moderation endpoint {url} unreachable: {exc!r}") from exc
        if resp.status_code == 429 or resp.status_code >= 500:
            raise ModerationUnavailable(f"moderation endpoint answered {resp.status_code}")
        if resp.status_code >= 400:
            raise ModerationUnavailable(
                f"moderation endpoint refused the request with {resp.status_code}: "
                f"{resp.text[:300]}", retryable=False)
        try:
            result = resp.json()["results"][0]
            categories = result.get("categories") or {}
            flagged = bool(result["flagged"])
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModerationUnavailable(f"moderation endpoint sent an unusable body: "
                                        f"{resp.text[:300]}", retryable=False) from exc
        hits = sorted(k for k, v in categories.items() if v)
        return ModerationResult(flagged=flagged, categories=hits, source=self.name)


@dataclass
class AnyModerator:
    moderators: Sequence[Moderator]
    name: str = "any"

    async def __call__(self, ctx: ModerationContext) -> ModerationResult:
        categories: list[str] = []
        sources = []
        for m in self.moderators:
            r = await moderate(m, ctx)
            sources.append(r.source)
            if r.flagged:
                categories += [c for c in r.categories or [r.source] if c not in categories]
        return ModerationResult(flagged=bool(categories), categories=categories,
                                source=", ".join(sources))


async def moderate(moderator: Moderator, ctx: ModerationContext) -> ModerationResult:
    result = await invoke(moderator, ctx)
    if not isinstance(result, ModerationResult):
        raise TypeError(f"moderator returned {type(result).__name__}, not a ModerationResult")
    return result
