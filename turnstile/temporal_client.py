"""Connecting to Temporal with the project's data converter."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from turnstile.config import Settings


async def connect(settings: Settings) -> Client:
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
    )


def web_ui_url(settings: Settings, workflow_id: str, ui: str = "http://localhost:8233") -> str:
    return f"{ui}/namespaces/{settings.temporal_namespace}/workflows/{workflow_id}"
