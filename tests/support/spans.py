"""One in-memory span exporter for the whole test run.

OpenTelemetry accepts one global tracer provider per process, so every test
that reads spans shares this one (and clears it first)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from turnstile.runtime.tracing import add_masking


@pytest.fixture(scope="session")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    add_masking(provider)  # as turnstile.runtime.tracing.setup_tracing does
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter
