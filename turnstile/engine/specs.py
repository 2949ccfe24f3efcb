"""Service and tool descriptions as data.

A worker turns its registered services into a `ServiceSpec` (activity
`describe_service`); the workflow reads only this spec, so the policies that
steer a turn are recorded in its history and replay identically.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field

from turnstile.engine.breakers import BreakerPolicy
from turnstile.engine.pipeline_spec import PipelineSpec


class RetrySpec(BaseModel):
    """Temporal retry policy of one tool's activity."""

    maximum_attempts: int = 3  # 0 = unlimited
    initial_interval_seconds: float = 1.0
    backoff_coefficient: float = 2.0
    maximum_interval_seconds: float = 30.0


class ToolSpec(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    idempotent: bool = False  # safe to run twice with the same call id
    requires_approval: bool = False
    fatal_on_failure: bool = False  # terminal failure means the task cannot be done
    compensation: str | None = None  # name of the compensation, if any
    start_to_close_seconds: float = 60.0
    heartbeat_seconds: float | None = 10.0
    retry: RetrySpec = Field(default_factory=RetrySpec)
    approval_timeout_seconds: float = 3600.0  # then the default policy rejects

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


class LoopPolicy(BaseModel):
    """How the tool round-trip loop reacts to the model (docs/design.md, "Tool calling")."""

    max_round_trips: int = 100
    on_unknown_tool: Literal["tell_model", "fail"] = "tell_model"
    on_invalid_arguments: Literal["tell_model", "fail"] = "tell_model"
    on_rejection: Literal["tell_model", "fail"] = "tell_model"  # a reviewer said no
    argument_error_budget: int = 3  # per tool per turn, then the turn fails
    model_timeout_seconds: float = 180.0  # one model request
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

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)
