"""The project's data converter: temporalio.contrib.pydantic's JSON, with its
encoding converters (and so pydantic's TypeAdapters) built once per process."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter

from turnstile.engine.contract import TurnInput, TurnStatus
from turnstile.engine.events import TurnStarted
from turnstile.runtime import client
from turnstile.runtime.client import PydanticPayloadConverter


def test_same_payloads_as_the_sdk_pydantic_converter() -> None:
    ours = DataConverter(payload_converter_class=PydanticPayloadConverter).payload_converter
    sdk = pydantic_data_converter.payload_converter
    values = [TurnInput(conversation_id="c", user_id="u", message="hé \u2028"),
              TurnStatus.COMPLETED, {"at": datetime(2026, 12, 2, tzinfo=UTC)}, None, b"\x00"]
    assert ours.to_payloads(values) == sdk.to_payloads(values)
    back = ours.from_payloads(sdk.to_payloads(values), [TurnInput, TurnStatus, dict, type(None),
                                                        bytes])
    assert back[0] == values[0] and back[1] is TurnStatus.COMPLETED and back[4] == b"\x00"


def test_every_converter_the_sdk_makes_shares_the_type_adapters() -> None:
    """The SDK makes a new payload converter per workflow activation and per
    activity task (DataConverter.__post_init__); each starts with the
    process's TypeAdapter cache instead of an empty one."""
    first = DataConverter(payload_converter_class=PydanticPayloadConverter)
    second = dataclasses.replace(first)  # what the SDK does per serialization context
    assert PydanticPayloadConverter() is PydanticPayloadConverter()  # built once
    event = TurnStarted(event_id="e", workflow_id="w", run_id="r", conversation_id="c",
                        user_id="u", service="s", at="2026-12-02T00:00:00+00:00")
    payloads = first.payload_converter.to_payloads([event])
    assert first.payload_converter.from_payloads(payloads, [TurnStarted]) == [event]
    cache = client._PYDANTIC_JSON._type_adapter
    misses = cache.cache_info().misses
    assert second.payload_converter.from_payloads(payloads, [TurnStarted]) == [event]
    assert cache.cache_info().misses == misses  # the adapter the first one built


def test_an_unchanged_payload_sequence_comes_back_itself() -> None:
    """The SDK's visitor copies a sequence back into the activation unless the
    converter returns the very sequence (turnstile.runtime.payload_visits). A
    payload above the claim-check threshold still comes back as a reference:
    tests/test_large_payloads.py runs turns through it."""
    import asyncio

    from temporalio.api.common.v1 import Payloads
    from temporalio.converter import StorageDriverStoreContext, StorageDriverWorkflowInfo

    from turnstile.runtime.config import Settings
    from turnstile.runtime.payload_visits import VISITED, InPlaceDataConverter

    for name in VISITED:  # the SDK's private methods this relies on
        assert callable(getattr(DataConverter, name)), name
    settings = dataclasses.replace(Settings.from_env(), payload_threshold=1024)
    dc = client.converter(settings)
    assert isinstance(dc, InPlaceDataConverter)
    store = StorageDriverStoreContext(target=StorageDriverWorkflowInfo(
        id="w", run_id="r", type="AgentTurn", namespace="default"))
    bound = dc._with_store_context(store)
    assert isinstance(bound, InPlaceDataConverter)
    small = Payloads(payloads=dc.payload_converter.to_payloads(["a", {"b": 1}]))

    async def visit() -> None:
        for name in VISITED:
            assert await getattr(bound, name)(small.payloads) is small.payloads, name

    asyncio.run(visit())
