"""Typed turn events (steps 4 and 17) and the worker-side listeners.

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

import logging
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal

from opentelemetry import trace
from pydantic import BaseModel, Field

log = logging.getLogger("turnstile.events")


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
    status: str  # a TurnStatus value, or "cancelled"
    round_trips: int = 0
    tool_calls: int = 0
    usage: dict[str, int] = Field(default_factory=dict)
    error_type: str | None = None
    duration_seconds: float = 0.0  # workflow time from TurnStarted


TurnEventRecord = Annotated[TurnStarted | TurnCompleted, Field(discriminator="kind")]
Listener = Callable[[TurnStarted | TurnCompleted], None]


def _flat(event: TurnStarted | TurnCompleted) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in event.model_dump().items():
        if isinstance(v, dict):
            out.update({f"turnstile.{k}.{kk}": vv for kk, vv in v.items()})
        elif v is not None:
            out[f"turnstile.{k}"] = v
    return out


class LoggingListener:
    def __call__(self, event: TurnStarted | TurnCompleted) -> None:
        log.info("%s %s", event.kind, event.model_dump_json())


class OpenTelemetryListener:
    """A span per event (child of the current span: the activity's, when the
    worker traces), carrying the event's fields as attributes and an event."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("turnstile.events", tracer_provider=tracer_provider)

    def __call__(self, event: TurnStarted | TurnCompleted) -> None:
        attrs = _flat(event)
        with self.tracer.start_as_current_span(f"turnstile.{event.kind}",
                                               attributes=attrs) as span:
            span.add_event(f"turnstile.{event.kind}", attrs)


class EventBus:
    def __init__(self, listeners: Iterable[Listener] | None = None) -> None:
        self.listeners: list[Listener] = (list(listeners) if listeners is not None
                                          else [LoggingListener(), OpenTelemetryListener()])

    def publish(self, event: TurnStarted | TurnCompleted) -> list[str]:
        """Deliver to every listener; returns the errors of those that failed."""
        errors = []
        for listener in self.listeners:
            try:
                listener(event)
            except Exception as exc:  # a listener never changes the turn's outcome
                log.exception("event listener %r failed on %s", listener, event.event_id)
                errors.append(f"{type(exc).__name__}: {exc}")
        return errors
