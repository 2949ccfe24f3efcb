"""OpenTelemetry: Temporal's tracing interceptor plus spans for model and tool
calls with GenAI semantic-convention attributes.

Exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set, otherwise to
a JSON-lines file under .data/ (the embedded default) so a user can read the
spans without a collector. Metrics (`turnstile.email.dead`) likewise: OTLP/HTTP
`/v1/metrics` every 10 s, or `.data/metrics.jsonl`. Workflow spans come from the interceptor, which
does not create them while a workflow replays; model and tool spans are made
inside activities, which never replay: no span is emitted twice.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanContext, Status, StatusCode
from temporalio.contrib.opentelemetry import TracingInterceptor

from turnstile.engine.masking import mask_text
from turnstile.runtime.config import Settings

log = logging.getLogger(__name__)
TRACER = "turnstile"
# Got once: `get_tracer` walks the provider's registry (and a deprecation
# check) on every call. Before a provider is installed this is OpenTelemetry's
# proxy tracer, which uses the process's provider once there is one.
_tracer = trace.get_tracer(TRACER)
_configured = False
_lock = threading.Lock()


def _iso(ns: int | None) -> str | None:
    if not ns:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _context(ctx: SpanContext) -> dict[str, str]:
    return {"trace_id": f"0x{ctx.trace_id:032x}", "span_id": f"0x{ctx.span_id:016x}",
            "trace_state": repr(ctx.trace_state)}


def _attrs(attributes: Any) -> dict[str, Any] | None:
    return dict(attributes) if attributes is not None else None


class JsonLinesSpanExporter(SpanExporter):
    """One JSON object per finished span, appended to a file.

    The objects are `ReadableSpan.to_json()`'s (same keys, same values), built
    directly: to_json serializes the span's resource and parses it back for
    every span, which made the export thread one of a turn's larger CPU costs
    (bench/HISTORY.md). Here a resource is serialized once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._resource_json: tuple[Resource, Any] | None = None  # the provider's, serialized

    def _resource(self, resource: Resource) -> Any:
        if self._resource_json is None or self._resource_json[0] is not resource:
            self._resource_json = (resource, json.loads(resource.to_json(indent=None)))
        return self._resource_json[1]

    def line(self, span: ReadableSpan) -> str:
        status: dict[str, str] = {"status_code": span.status.status_code.name}
        if span.status.description:
            status["description"] = span.status.description
        return json.dumps({
            "name": span.name,
            "context": _context(span.context) if span.context else None,
            "kind": str(span.kind),
            "parent_id": f"0x{span.parent.span_id:016x}" if span.parent else None,
            "start_time": _iso(span.start_time),
            "end_time": _iso(span.end_time),
            "status": status,
            "attributes": _attrs(span.attributes),
            "events": [{"name": e.name, "timestamp": _iso(e.timestamp),
                        "attributes": _attrs(e.attributes)} for e in span.events],
            "links": [{"context": _context(link.context), "attributes": _attrs(link.attributes)}
                      for link in span.links],
            "resource": self._resource(span.resource),
        })

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [self.line(span) for span in spans]
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class MaskingSpanProcessor(SpanProcessor):
    """Text attributes of every span masked as they are set at its start
    (turnstile.engine.masking): Temporal's interceptor puts the workflow id
    there (`temporalWorkflowID`), and an id that holds an address reads on a
    span as on a log line. Attributes set later are Turnstile's own (model,
    tool name, counts), and `tool_span` masks the one id among them."""

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        for key, value in dict(getattr(span, "attributes", None) or {}).items():
            if isinstance(value, str) and mask_text(value) != value:
                span.set_attribute(key, mask_text(value))


def add_masking(provider: TracerProvider) -> None:
    """What every Turnstile tracer provider gets before its exporters."""
    provider.add_span_processor(MaskingSpanProcessor())


def setup_tracing(settings: Settings, service_name: str) -> TracerProvider | None:
    """Install the process's tracer provider once; returns it (None if one was
    already installed, e.g. by the host application)."""
    global _configured
    with _lock:
        if _configured:
            return None
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        add_masking(provider)
        if settings.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter: SpanExporter = OTLPSpanExporter(
                endpoint=settings.otlp_endpoint.rstrip("/") + "/v1/traces")
            log.info("tracing: OTLP/HTTP to %s", settings.otlp_endpoint)
        else:
            exporter = JsonLinesSpanExporter(settings.data_dir / "traces.jsonl")
            log.info("tracing: spans written to %s", settings.data_dir / "traces.jsonl")
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(_meter_provider(settings, provider.resource))
        _configured = True
        return provider


def _meter_provider(settings: Settings, resource: Resource) -> MeterProvider:
    exporter: MetricExporter
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter(endpoint=settings.otlp_endpoint.rstrip("/") + "/v1/metrics")
    else:
        path = settings.data_dir / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        exporter = ConsoleMetricExporter(
            out=open(path, "a", encoding="utf-8"),  # noqa: SIM115 (lives with the process)
            formatter=lambda data: data.to_json(indent=None) + "\n")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=10_000)
    return MeterProvider(resource=resource, metric_readers=[reader])


def interceptors() -> list[TracingInterceptor]:
    """Temporal's tracing interceptor, for the client (workers inherit it)."""
    return [TracingInterceptor()]


@contextmanager
def model_span(provider: str, model: str | None, round_: int) -> Iterator[Span]:
    with _tracer.start_as_current_span(f"chat {model or provider}",
                                       kind=trace.SpanKind.CLIENT) as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.provider.name", provider)
        if model:
            span.set_attribute("gen_ai.request.model", model)
        span.set_attribute("turnstile.round", round_)
        yield span


def record_model_response(span: Span, *, model: str, input_tokens: int, output_tokens: int,
                          finish_reason: str | None, tool_calls: int) -> None:
    if model:
        span.set_attribute("gen_ai.response.model", model)
    span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    if finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    span.set_attribute("turnstile.tool_calls", tool_calls)


@contextmanager
def tool_span(name: str, call_id: str, attempt: int) -> Iterator[Span]:
    with _tracer.start_as_current_span(f"execute_tool {name}",
                                       kind=trace.SpanKind.INTERNAL) as span:
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", name)
        span.set_attribute("gen_ai.tool.call.id", mask_text(call_id))
        span.set_attribute("turnstile.tool.attempt", attempt)
        yield span


def record_tool_outcome(span: Span, outcome: str, is_error: bool) -> None:
    span.set_attribute("turnstile.tool.outcome", outcome)
    if is_error:
        span.set_status(Status(StatusCode.ERROR, outcome))

