"""Model providers: OpenAI-compatible HTTP, or the offline demo planner."""

from __future__ import annotations

from collections.abc import Sequence

from turnstile.providers.base import ModelProvider, ModelRequest, ModelResponse
from turnstile.providers.demo_planner import DemoPlanner, DemoScript
from turnstile.providers.openai_compat import OpenAICompatibleProvider
from turnstile.runtime.config import Settings

__all__ = [
    "DemoPlanner",
    "DemoScript",
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "OpenAICompatibleProvider",
    "build_provider",
]


def build_provider(settings: Settings, demo_scripts: Sequence[DemoScript] = ()) -> ModelProvider:
    """The OpenAI-compatible provider of LLM_BASE_URL; without one, the offline
    demo planner following `demo_scripts` (the apps')."""
    if settings.llm_base_url:
        return OpenAICompatibleProvider(
            settings.llm_base_url,
            api_key=settings.llm_api_key,
            model=settings.llm_model,
            timeout_seconds=settings.llm_timeout_seconds,
            schema_dialect=settings.llm_schema_dialect,
        )
    return DemoPlanner(demo_scripts)
