"""Connecting to Temporal with the project's data converter."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Self, cast

from pydantic import TypeAdapter
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, Interceptor, Plugin
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    SerializationContext,
)
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode

from turnstile.runtime.config import Settings
from turnstile.runtime.payload_visits import InPlaceDataConverter
from turnstile.stores.db import Database
from turnstile.stores.payload_store import data_converter as payload_data_converter


# One pydantic JSON converter per process. The SDK builds a new payload
# converter from its class for every workflow activation and every activity
# task (DataConverter.__post_init__, once per serialization context), and
# temporalio.contrib.pydantic's converter starts each instance with an empty
# TypeAdapter cache: each payload then rebuilt its TypeAdapter. Sharing the
# encoding converters keeps the cache for the process's life (lru_cache is
# thread-safe; none of these converters holds per-context state).
class TolerantPydanticJSON(PydanticJSONPlainPayloadConverter):
    """pydantic JSON that also reads what JSON allows and pydantic's parser does
    not: a lone UTF-16 surrogate escape ("\\ud800"), which the Temporal CLI
    passes through from `--input`. Read with the standard library's parser and
    validated as Python data, such a value reaches the turn, whose door refuses
    it with a clear error (turnstile.engine.turn_input_rules) instead of the
    turn failing on its own input."""

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        try:
            return super().from_payload(payload, type_hint)
        except ValueError:
            if not _SURROGATE_ESCAPE.search(payload.data):
                raise
        value = json.loads(payload.data)
        return TypeAdapter(type_hint if type_hint is not None else Any).validate_python(value)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_PYDANTIC_JSON = TolerantPydanticJSON()
_ENCODINGS = tuple(_PYDANTIC_JSON if isinstance(c, JSONPlainPayloadConverter) else c
                   for c in DefaultPayloadConverter.default_encoding_payload_converters)


class PydanticPayloadConverter(CompositePayloadConverter):
    """temporalio.contrib.pydantic's payload converter (the same encodings, the
    same JSON), one instance per process: the SDK calls the class for every
    DataConverter it derives — several per workflow activation and per
    activity task (a serialization context, a store context, the
    command-aware converter) — and building the composite each time was ~2%
    of a turn's worker CPU (bench/profile_turn.py). It holds no per-context
    state; a context that one of its encodings would take gets an instance
    of its own (with_context)."""

    _shared: ClassVar[dict[type, CompositePayloadConverter]] = {}

    def __new__(cls) -> Self:
        shared = PydanticPayloadConverter._shared.get(cls)
        if shared is None:
            shared = super().__new__(cls)
            CompositePayloadConverter.__init__(shared, *_ENCODINGS)
            PydanticPayloadConverter._shared[cls] = shared
        return cast(Self, shared)

    def __init__(self) -> None:  # built once, in __new__
        pass

    def with_context(self, context: SerializationContext) -> Self:
        converters = self.get_converters_with_context(context)
        if converters is None:
            return self
        own = super().__new__(type(self))  # not the shared one: it would change for all
        own._set_converters(*converters)
        return own


def converter(settings: Settings) -> DataConverter:
    """pydantic JSON, with payloads above the threshold claim-checked into the
    project's database (turnstile.stores.payload_store)."""
    db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
    base = InPlaceDataConverter(payload_converter_class=PydanticPayloadConverter)
    return payload_data_converter(db, base, settings.payload_threshold)


def workflow_gone(err: RPCError) -> bool:
    """Whether `err` says the workflow does not run: it ended, or never was.
    Temporal answers a signal or update to a closed workflow with NOT_FOUND
    ("workflow execution already completed", measured on the pinned dev
    server): the status tells it, never the message's wording."""
    return err.status == RPCStatusCode.NOT_FOUND


class TemporalUnreachable(RuntimeError):
    """No Temporal server answered at the configured address (or it refused
    the connection: TLS, API key). Says where it looked."""


async def connect(settings: Settings, interceptors: Sequence[Interceptor] = (),
                  runtime: Runtime | None = None, plugins: Sequence[Plugin] = ()) -> Client:
    """A client of the cluster the settings name: address and namespace, and
    the TLS, API key and gRPC metadata of the Temporal environment profile
    (Settings.temporal_profile), so one build reaches a dev server, an mTLS
    cluster or Temporal Cloud. `plugins`: e.g. the worker's TurnstilePlugin
    (whose data converter is this one)."""
    options: dict[str, Any] = dict(settings.temporal_profile.to_client_connect_config())
    options.update(target_host=settings.temporal_address,
                   namespace=settings.temporal_namespace)
    try:
        return await Client.connect(
            **options,
            data_converter=converter(settings),
            interceptors=interceptors,
            runtime=runtime,
            plugins=plugins,
        )
    except RuntimeError as e:
        if "Failed client connect" not in str(e):
            raise
        raise TemporalUnreachable(
            f"cannot reach Temporal at {settings.temporal_address} (namespace "
            f"{settings.temporal_namespace!r}; set TEMPORAL_ADDRESS or a profile, "
            f"TEMPORAL_PROFILE / TEMPORAL_CONFIG_FILE): {e}") from e


def metrics_runtime(settings: Settings) -> Runtime | None:
    """A Temporal runtime whose Prometheus endpoint (TURNSTILE_METRICS_HOST:_PORT)
    serves the SDK's metrics and Turnstile's own, recorded through the SDK's
    meters (workflow metrics are not recorded during replay). None: no
    endpoint. One endpoint for both, and replay-safe workflow metrics, is why
    this is the SDK's exporter rather than a second OpenTelemetry registry."""
    if settings.metrics_port is None:
        return None
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(
        bind_address=f"{settings.metrics_host}:{settings.metrics_port}",
        durations_as_seconds=True)))


def web_ui_url(settings: Settings, workflow_id: str) -> str:
    return f"{settings.web_ui_url}/namespaces/{settings.temporal_namespace}/workflows/{workflow_id}"

