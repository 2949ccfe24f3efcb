"""Typed turn events (steps 4 and 17); the listeners live in
`turnstile.runtime.event_bus`.

The workflow sends each event once through the `turnstile.publish_event`
local activity: its result is a marker in history, so a replay (a new worker,
`max_cached_workflows=0`) reads the marker instead of publishing again. A
failed attempt may be retried, so `event_id` is stable per turn and kind, for
listeners that must de-duplicate.

Listeners are plain callables; the defaults log one line per event (logger
`turnstile.events`) and record an OpenTelemetry span. A failing listener is
logged and never changes the turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from turnstile.engine.contract import TurnStatus
from turnstile.engine.messages import Usage


class _TurnEvent(BaseModel):
    event_id: str  # "{workflow_id}/{run_id}/{kind}": stable across retries
    workflow_id: str
    run_id: str
    conversation_id: str
    user_id: str
    service: str
    at: str  # workflow time (deterministic), ISO 8601


class TurnStarted(_TurnEvent):
    kind: Literal["turn_started"] = "turn_started"


class TurnCompleted(_TurnEvent):
    kind: Literal["turn_completed"] = "turn_completed"
    status: TurnStatus
    round_trips: int = 0
    tool_calls: int = 0
    usage: Usage = Field(default_factory=Usage)
    error_type: str | None = None
    duration_seconds: float = 0.0  # workflow time from TurnStarted (to the millisecond)


TurnEventRecord = Annotated[TurnStarted | TurnCompleted, Field(discriminator="kind")]
Listener = Callable[[TurnStarted | TurnCompleted], None]
