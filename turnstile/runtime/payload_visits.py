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

from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter

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
