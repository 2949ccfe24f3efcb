"""A data converter that leaves unchanged payloads where they are.

For every workflow activation and completion the SDK walks every payload
six times (temporalio.bridge.worker: decode_activation, encode_completion):
codec, external storage and storage references, each way. Each pass hands a
repeated field of payloads to the converter and, unless it gets *the same
sequence object* back, empties the field and copies the returned payloads
into it (`_Visitor.visit_payloads`). The SDK's own methods always return a
new list, so every payload of every activation and command — a model call's
input, a tool's preview, a turn's result — was copied six times per
activation even though, without a codec and below the claim-check threshold,
nothing changed: the copies were ~13% of a turn's sampled worker CPU
(bench/profile_turn.py, `_Visitor.visit_payloads`).

`InPlaceDataConverter` returns the given sequence when every payload it would
return is the very payload it was given, so the visitor keeps the field as it
is. Whatever does change (a payload stored externally, a codec) comes back
as before. The six methods are the SDK's private API (temporalio pinned in
pyproject.toml); tests/test_data_converter.py fails if they go away.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import temporalio.bridge.worker as sdk_bridge
from temporalio.api.common.v1 import Payload
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.bridge.worker import _Visitor
from temporalio.converter import DataConverter
from temporalio.converter._extstore import (
    _REFERENCE_ENCODING,
    _REFERENCE_MARKER_KEY,
    _REFERENCE_MESSAGE_TYPE,
    StorageOperationMetrics,
)
from temporalio.worker._command_aware_visitor import CommandAwarePayloadVisitor

# The DataConverter methods the SDK's payload visitor calls with a sequence.
VISITED = (
    "_encode_payload_sequence",
    "_external_store_payload_sequence",
    "_encode_reference_payload_sequence",
    "_decode_reference_payload_sequence",
    "_external_retrieve_payload_sequence",
    "_decode_payload_sequence",
)


def _same(given: Sequence[Payload], got: list[Payload]) -> list[Payload]:
    """`given` itself when `got` holds exactly its payloads (the objects, in
    order), else `got`. (Typed as the SDK's list: the visitor compares the
    result with what it passed by identity, then only reads it.)"""
    if len(got) == len(given) and all(a is b for a, b in zip(got, given, strict=True)):
        return cast(list[Payload], given)
    return got


class InPlaceDataConverter(DataConverter):
    """DataConverter whose visited methods hand back an unchanged sequence
    itself (see the module's doc). `with_context` and the store context
    copy it with dataclasses.replace, which keeps the class."""

    async def _encode_payload_sequence(self, payloads: Sequence[Payload]) -> list[Payload]:
        return _same(payloads, await super()._encode_payload_sequence(payloads))

    async def _external_store_payload_sequence(
            self, payloads: Sequence[Payload]) -> list[Payload]:
        return _same(payloads, await super()._external_store_payload_sequence(payloads))

    async def _encode_reference_payload_sequence(
            self, payloads: Sequence[Payload]) -> list[Payload]:
        return _same(payloads, await super()._encode_reference_payload_sequence(payloads))

    async def _decode_reference_payload_sequence(
            self, payloads: Sequence[Payload]) -> list[Payload]:
        return _same(payloads, await super()._decode_reference_payload_sequence(payloads))

    async def _external_retrieve_payload_sequence(
            self, payloads: Sequence[Payload]) -> list[Payload]:
        return _same(payloads, await super()._external_retrieve_payload_sequence(payloads))

    async def _decode_payload_sequence(self, payloads: Sequence[Payload]) -> list[Payload]:
        return _same(payloads, await super()._decode_payload_sequence(payloads))


# One walk instead of three. The SDK's `decode_activation` and
# `encode_completion` (temporalio.bridge.worker) walk the whole activation or
# completion once per step — codec, external storage, storage references —
# and the walk itself (a generated visitor in Python, a method per message
# type, `HasField` on every field) costs more than the three steps together
# when nothing changes: ~150 µs per walk for a completion with two activity
# inputs, against ~10 µs per step (bench/README.md, "payload visits"). Each
# step works on one payload sequence at a time, so applying the three to each
# sequence in a single walk, in the SDK's order, gives the same payloads; the
# storage metrics are tracked around the walk as the SDK tracks them around
# its storage walk (only storage operations record into them).


# No walk at all when it cannot change anything. Without a codec the steps
# touch only two kinds of payload: on the way out, one at or above the claim
# check's threshold (stored, a reference sent instead); on the way in, a
# reference (read back). A completion smaller than the threshold holds no
# payload that large (each payload is a part of it), and an activation whose
# bytes contain none of a reference's marks (its encoding, its message type,
# its marker key: metadata is serialized verbatim) holds no reference. Such is
# almost every activation and completion of a turn: the walks were ~3.5 ms of
# a sales turn's worker CPU at concurrency 20 (bench/profile_turn.py). With
# a codec every payload changes: always walked.
_REFERENCE_MARKS = (_REFERENCE_ENCODING, _REFERENCE_MESSAGE_TYPE, _REFERENCE_MARKER_KEY.encode())


def nothing_to_encode(completion: WorkflowActivationCompletion,
                      data_converter: DataConverter) -> bool:
    """No codec, and no payload of `completion` large enough to be stored."""
    if data_converter.payload_codec is not None:
        return False
    storage = data_converter.external_storage
    return storage is None or completion.ByteSize() < storage.payload_size_threshold


def nothing_to_decode(activation: WorkflowActivation, data_converter: DataConverter) -> bool:
    """No codec, and no stored payload's reference in `activation`."""
    if data_converter.payload_codec is not None:
        return False
    data = activation.SerializeToString()
    return not any(mark in data for mark in _REFERENCE_MARKS)


# The SDK's own, as imported (walk_once replaces them in their module).
SDK_WALKS = (sdk_bridge.decode_activation, sdk_bridge.encode_completion)


async def decode_activation(
    activation: WorkflowActivation, data_converter: DataConverter, decode_headers: bool,
    storage_concurrency_limit: int,
) -> StorageOperationMetrics:
    """`temporalio.bridge.worker.decode_activation` in one walk, or none
    when no step could change a payload (`nothing_to_decode`)."""
    if nothing_to_decode(activation, data_converter):
        return StorageOperationMetrics()

    async def decode(payloads: Sequence[Payload]) -> list[Payload]:
        step = await data_converter._decode_reference_payload_sequence(payloads)
        step = await data_converter._external_retrieve_payload_sequence(step)
        return await data_converter._decode_payload_sequence(step)

    metrics = StorageOperationMetrics()
    with metrics.track():
        await CommandAwarePayloadVisitor(
            skip_search_attributes=True, skip_headers=not decode_headers,
            concurrency_limit=storage_concurrency_limit,
        ).visit(_Visitor(decode), activation)
    return metrics


async def encode_completion(
    completion: WorkflowActivationCompletion, data_converter: DataConverter,
    encode_headers: bool, storage_concurrency_limit: int,
) -> StorageOperationMetrics:
    """`temporalio.bridge.worker.encode_completion` in one walk, or none
    when no step could change a payload (`nothing_to_encode`)."""
    if nothing_to_encode(completion, data_converter):
        return StorageOperationMetrics()

    async def encode(payloads: Sequence[Payload]) -> list[Payload]:
        step = await data_converter._encode_payload_sequence(payloads)
        step = await data_converter._external_store_payload_sequence(step)
        return await data_converter._encode_reference_payload_sequence(step)

    metrics = StorageOperationMetrics()
    with metrics.track():
        await CommandAwarePayloadVisitor(
            skip_search_attributes=True, skip_headers=not encode_headers,
            concurrency_limit=storage_concurrency_limit,
        ).visit(_Visitor(encode), completion)
    return metrics


def walk_once() -> None:
    """Make the SDK's workflow worker use the one-walk functions above (it
    calls them through the module `temporalio.bridge.worker`). Idempotent;
    tests/test_data_converter.py checks they give the SDK's payloads."""
    sdk_bridge.decode_activation = decode_activation
    sdk_bridge.encode_completion = encode_completion
