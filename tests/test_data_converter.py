"""The project's data converter: temporalio.contrib.pydantic's JSON, with its
encoding converters (and so pydantic's TypeAdapters) built once per process."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, PayloadCodec

from turnstile.engine.contract import TurnInput, TurnStatus
from turnstile.engine.events import TurnStarted
from turnstile.runtime import client
from turnstile.runtime.client import PydanticPayloadConverter
from turnstile.stores.db import Database
from turnstile.stores.schema import upgrade


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


class _Flip(PayloadCodec):
    """A codec that changes every payload (reversibly), so the codec steps show."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [Payload(metadata={**p.metadata, "flip": b"1"}, data=p.data[::-1])
                for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            meta = dict(p.metadata)
            flipped = meta.pop("flip", None)
            out.append(Payload(metadata=meta, data=p.data[::-1] if flipped else p.data))
        return out


def _completion(dc: DataConverter) -> WorkflowActivationCompletion:
    small, big = dc.payload_converter.to_payloads(["a", "x" * 5000])
    done = WorkflowActivationCompletion(run_id="r")
    first = done.successful.commands.add().schedule_activity
    first.activity_id, first.activity_type = "1", "turnstile.call_model"
    first.arguments.extend([small, big])
    first.headers["h"].CopyFrom(small)
    done.successful.commands.add().complete_workflow_execution.result.CopyFrom(big)
    return done


@pytest.mark.parametrize("codec", [False, True])
def test_one_walk_gives_the_sdks_payloads(tmp_path: Path, codec: bool) -> None:
    """turnstile.runtime.payload_visits walks an activation or a completion
    once, applying the SDK's three steps to each payload sequence; the SDK
    walks it once per step. Same payloads either way: small ones untouched,
    one above the claim-check threshold stored and read back, every one
    through a codec when there is one."""
    from temporalio.converter import StorageDriverStoreContext, StorageDriverWorkflowInfo

    from turnstile.runtime import payload_visits
    from turnstile.runtime.config import Settings

    settings = dataclasses.replace(Settings.from_env(), payload_threshold=1024,
                                   database_url=f"sqlite:///{tmp_path / 'p.db'}")
    upgrade(Database(settings.database_url))
    dc = client.converter(settings)
    if codec:
        dc = dataclasses.replace(dc, payload_codec=_Flip())
    dc = dc._with_store_context(StorageDriverStoreContext(target=StorageDriverWorkflowInfo(
        id="w", run_id="r", type="AgentTurn", namespace="default")))
    sdk_decode, sdk_encode = payload_visits.SDK_WALKS

    async def both() -> None:
        ours, theirs = _completion(dc), _completion(dc)
        await payload_visits.encode_completion(ours, dc, True, 1)
        await sdk_encode(theirs, dc, True, 1)
        assert ours == theirs
        assert ours != _completion(dc)  # the big one became a reference (and the codec's)
        encoded = ours.successful.commands[0].schedule_activity.arguments
        activation = WorkflowActivation(run_id="r")
        activation.jobs.add().resolve_activity.result.completed.result.CopyFrom(encoded[1])
        twin = WorkflowActivation()
        twin.CopyFrom(activation)
        await payload_visits.decode_activation(activation, dc, True, 1)
        await sdk_decode(twin, dc, True, 1)
        assert activation == twin
        original = _completion(dc).successful.commands[0].schedule_activity.arguments[1]
        assert activation.jobs[0].resolve_activity.result.completed.result == original

    asyncio.run(both())


def test_the_worker_walks_once() -> None:
    """build_worker puts the one-walk functions where the SDK's worker calls them."""
    import temporalio.bridge.worker as sdk_bridge

    from turnstile.runtime import payload_visits

    payload_visits.walk_once()
    assert sdk_bridge.encode_completion is payload_visits.encode_completion
    assert sdk_bridge.decode_activation is payload_visits.decode_activation
    assert all(callable(f) for f in payload_visits.SDK_WALKS)


def test_a_walk_is_skipped_only_when_it_would_change_nothing(tmp_path: Path) -> None:
    """turnstile.runtime.payload_visits makes no walk when no step could change
    a payload (no codec; a completion below the claim-check threshold; an
    activation holding no reference). Generated completions of payloads
    around the threshold, with and without a codec: encoded, then read back
    in an activation, each the same as the SDK's walks give; both the
    skipped and the walked paths are taken."""
    from hypothesis import HealthCheck, given, settings as hsettings, strategies as st
    from temporalio.converter import StorageDriverStoreContext, StorageDriverWorkflowInfo

    from turnstile.runtime import payload_visits
    from turnstile.runtime.config import Settings

    threshold = 1024
    settings = dataclasses.replace(Settings.from_env(), payload_threshold=threshold,
                                   database_url=f"sqlite:///{tmp_path / 'p.db'}")
    upgrade(Database(settings.database_url))
    store = StorageDriverStoreContext(target=StorageDriverWorkflowInfo(
        id="w", run_id="r", type="AgentTurn", namespace="default"))
    plain = client.converter(settings)._with_store_context(store)
    coded = dataclasses.replace(plain, payload_codec=_Flip())
    sdk_decode, sdk_encode = payload_visits.SDK_WALKS
    skipped = {"encode": 0, "decode": 0, "walked": 0}

    def completion(dc: DataConverter, sizes: list[int]) -> WorkflowActivationCompletion:
        done = WorkflowActivationCompletion(run_id="r")
        command = done.successful.commands.add().schedule_activity
        command.activity_id, command.activity_type = "1", "turnstile.call_model"
        command.arguments.extend(dc.payload_converter.to_payloads(
            ["x" * n for n in sizes]))
        return done

    @hsettings(max_examples=40, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(sizes=st.lists(st.integers(0, 2 * threshold), min_size=1, max_size=4),
           codec=st.booleans())
    def same_as_the_sdk(sizes: list[int], codec: bool) -> None:
        dc = coded if codec else plain

        async def both() -> None:
            ours, theirs = completion(dc, sizes), completion(dc, sizes)
            if payload_visits.nothing_to_encode(ours, dc):
                skipped["encode"] += 1
            else:
                skipped["walked"] += 1
            await payload_visits.encode_completion(ours, dc, True, 1)
            await sdk_encode(theirs, dc, True, 1)
            assert ours == theirs
            activation = WorkflowActivation(run_id="r")
            for arg in ours.successful.commands[0].schedule_activity.arguments:
                activation.jobs.add().resolve_activity.result.completed.result.CopyFrom(arg)
            twin = WorkflowActivation()
            twin.CopyFrom(activation)
            if payload_visits.nothing_to_decode(activation, dc):
                skipped["decode"] += 1
            await payload_visits.decode_activation(activation, dc, True, 1)
            await sdk_decode(twin, dc, True, 1)
            assert activation == twin
            original = completion(dc, sizes).successful.commands[0].schedule_activity
            assert [job.resolve_activity.result.completed.result for job in activation.jobs] \
                == list(original.arguments)

        asyncio.run(both())

    same_as_the_sdk()
    assert skipped["encode"] and skipped["decode"] and skipped["walked"], skipped


def test_a_payload_has_one_claim_key_whatever_its_metadata_order(tmp_path: Path) -> None:
    """The claim check addresses a stored payload by the SHA-256 of its bytes,
    serialized deterministically (metadata in key order): the same payload
    built with its metadata in another order, or copied, gets the same key
    (it was stored twice, and tests comparing two walks failed by chance)."""
    from temporalio.converter import StorageDriverStoreContext, StorageDriverWorkflowInfo

    from turnstile.stores.payload_store import DatabasePayloadDriver

    db = Database(f"sqlite:///{tmp_path / 'p.db'}")
    upgrade(db)
    keys = {f"k{i}": str(i).encode() for i in range(12)}
    forward = Payload(metadata=keys, data=b"x" * 2000)
    backward = Payload(metadata=dict(reversed(list(keys.items()))), data=b"x" * 2000)
    copied = Payload()
    copied.CopyFrom(backward)
    context = StorageDriverStoreContext(target=StorageDriverWorkflowInfo(
        id="w", run_id="r", type="AgentTurn", namespace="default"))
    claims = asyncio.run(DatabasePayloadDriver(db).store(context, [forward, backward, copied]))
    assert len({c.claim_data["sha256"] for c in claims}) == 1
