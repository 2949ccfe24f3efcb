"""Worker-side listeners of turn events: a log line and an OpenTelemetry span
each (logger `turnstile.events`). A failing listener is logged and never
changes the turn."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from opentelemetry import trace

from turnstile.engine.events import Listener, TurnCompleted, TurnStarted
from turnstile.engine.masking import mask_text

log = logging.getLogger("turnstile.events")


def _flat(event: TurnStarted | TurnCompleted) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in event.model_dump(mode="json").items():
        if isinstance(v, dict):
            out.update({f"turnstile.{k}.{kk}": vv for kk, vv in v.items()})
        elif v is not None:
            out[f"turnstile.{k}"] = v
    return out


class LoggingListener:
    def __call__(self, event: TurnStarted | TurnCompleted) -> None:
        if log.isEnabledFor(logging.INFO):  # the event's JSON only for a line logged
            log.info("%s %s", event.kind, event.model_dump_json())


class OpenTelemetryListener:
    """A span per event (child of the current span: the activity's, when the
    worker traces), carrying the event's fields as attributes and an event."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("turnstile.events", tracer_provider=tracer_provider)
        self.provider = tracer_provider

    def __call__(self, event: TurnStarted | TurnCompleted) -> None:
        provider = self.provider or trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return  # no provider installed: the span would record nothing
        # Ids masked as on every sink (an id that holds an address).
        attrs = {k: mask_text(v) if isinstance(v, str) else v for k, v in _flat(event).items()}
        with self.tracer.start_as_current_span(f"turnstile.{event.kind}",
                                               attributes=attrs) as span:
            span.add_event(f"turnstile.{event.kind}", attrs)


# The worker's own listeners: they never block (a log line, a span).
OWN_LISTENERS = (LoggingListener, OpenTelemetryListener)


class EventBus:
    def __init__(self, listeners: Iterable[Listener] | None = None) -> None:
        self.listeners: list[Listener] = (list(listeners) if listeners is not None
                                          else [LoggingListener(), OpenTelemetryListener()])

    @property
    def may_block(self) -> bool:
        """A listener other than the worker's own log line and span: it may
        block, so events are delivered from a thread (activities.pipeline)."""
        return not all(type(listener) in OWN_LISTENERS for listener in self.listeners)

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
