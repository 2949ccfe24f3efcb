"""Connecting to Temporal with the project's data converter."""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.client import Client, Interceptor
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
)

from turnstile.runtime.config import Settings
from turnstile.stores.db import Database
from turnstile.stores.payload_store import data_converter as payload_data_converter

# One pydantic JSON converter per process. The SDK builds a new payload
# converter from its class for every workflow activation and every activity
# task (DataConverter.__post_init__, once per serialization context), and
# temporalio.contrib.pydantic's converter starts each instance with an empty
# TypeAdapter cache: each payload then rebuilt its TypeAdapter. Sharing the
# encoding converters keeps the cache for the process's life (lru_cache is
# thread-safe; none of these converters holds per-context state).
_PYDANTIC_JSON = PydanticJSONPlainPayloadConverter()
_ENCODINGS = tuple(_PYDANTIC_JSON if isinstance(c, JSONPlainPayloadConverter) else c
                   for c in DefaultPayloadConverter.default_encoding_payload_converters)


class PydanticPayloadConverter(CompositePayloadConverter):
    """temporalio.contrib.pydantic's payload converter (the same encodings, the
    same JSON), built from the process's shared encoding converters."""

    def __init__(self) -> None:
        super().__init__(*_ENCODINGS)


def converter(settings: Settings) -> DataConverter:
    """pydantic JSON, with payloads above the threshold claim-checked into the
    project's database (turnstile.stores.payload_store)."""
    db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
    base = DataConverter(payload_converter_class=PydanticPayloadConverter)
    return payload_data_converter(db, base, settings.payload_threshold)


async def connect(settings: Settings, interceptors: Sequence[Interceptor] = ()) -> Client:
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=converter(settings),
        interceptors=interceptors,
    )


def web_ui_url(settings: Settings, workflow_id: str, ui: str = "http://localhost:8233") -> str:
    return f"{ui}/namespaces/{settings.temporal_namespace}/workflows/{workflow_id}"
