"""Model providers: OpenAI-compatible HTTP, or the offline demo planner."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from turnstile.engine.model_settings import SchemaDialect
from turnstile.providers.base import ModelProvider, ModelRequest, ModelResponse
from turnstile.providers.demo_planner import DemoPlanner, DemoScript
from turnstile.providers.openai_compat import OpenAICompatibleProvider

__all__ = [
    "DemoPlanner",
    "DemoScript",
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "OpenAICompatibleProvider",
    "ProviderSettings",
    "build_provider",
]


class ProviderSettings(Protocol):
    """The settings a provider is built from: turnstile.runtime.config.Settings
    has them (the runtime imports the providers, never the other way round)."""

    @property
    def llm_base_url(self) -> str | None: ...
    @property
    def llm_api_key(self) -> str | None: ...
    @property
    def llm_model(self) -> str | None: ...
    @property
    def llm_timeout_seconds(self) -> float: ...
    @property
    def llm_schema_dialect(self) -> SchemaDialect: ...


def build_provider(settings: ProviderSettings,
                   demo_scripts: Sequence[DemoScript] = ()) -> ModelProvider:
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
