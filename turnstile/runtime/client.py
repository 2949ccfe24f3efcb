"""Connecting to Temporal with the project's data converter."""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.client import Client, Interceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter

from turnstile.runtime.config import Settings
from turnstile.stores.db import Database
from turnstile.stores.payload_store import data_converter as payload_data_converter


def converter(settings: Settings) -> DataConverter:
    """pydantic JSON, with payloads above the threshold claim-checked into the
    project's database (turnstile.stores.payload_store)."""
    db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
    return payload_data_converter(db, pydantic_data_converter, settings.payload_threshold)


async def connect(settings: Settings, interceptors: Sequence[Interceptor] = ()) -> Client:
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=converter(settings),
        interceptors=interceptors,
    )


def web_ui_url(settings: Settings, workflow_id: str, ui: str = "http://localhost:8233") -> str:
    return f"{ui}/namespaces/{settings.temporal_namespace}/workflows/{workflow_id}"
