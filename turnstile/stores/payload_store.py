"""Claim check for payloads too large for Temporal, built on the SDK's
external payload storage (`DataConverter.external_storage`).

Any payload above the threshold (a huge model answer, tool arguments, a turn
result) is stored in the project's database under the SHA-256 of its bytes
and replaced in history by a small reference. Retrieval checks the hash, so a
corrupted or swapped blob fails loudly instead of feeding wrong data to a
workflow. Each blob is referenced by the workflows that stored it; `sweep`
deletes blobs that no running or retained workflow references.

Tool results never need this: they go to chat memory, and history keeps a
bounded preview (see activities/tool_calls.py).

This module is the one writer of `payload_blob` and `payload_ref`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import sqlalchemy as sa
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
)
from temporalio.service import RPCError, RPCStatusCode

from turnstile.stores.db import Database
from turnstile.stores.memory import now_iso
from turnstile.stores.tables import metadata

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 256 * 1024  # bytes; Temporal refuses payloads above 2 MiB


class PayloadIntegrityError(Exception):
    """A stored payload does not hash to its key, or is missing."""


payload_blob = sa.Table(
    "payload_blob", metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),  # BLOB / BYTEA
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
)

payload_ref = sa.Table(
    "payload_ref", metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("workflow_id", sa.Text, primary_key=True),
)
blob = payload_blob.c
ref = payload_ref.c


class Blob(NamedTuple):
    key: str
    data: bytes  # bytes from either driver (BLOB / BYTEA)


def _owner(context: StorageDriverStoreContext) -> str:
    """The workflow a payload belongs to, for retention. The SDK names the
    workflow as the target both in workflow code and in its activities."""
    if isinstance(context.target, StorageDriverWorkflowInfo) and context.target.id:
        return context.target.id
    return "?"  # never released by `sweep`: kept rather than risk a live reference


class DatabasePayloadDriver(StorageDriver):
    def __init__(self, db: Database, name: str = "turnstile-db") -> None:
        self.db = db
        self._name = name

    def name(self) -> str:
        return self._name

    def type(self) -> str:
        return "turnstile.database"

    async def store(self, context: StorageDriverStoreContext,
                    payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        owner = _owner(context)
        # Deterministic: metadata (a protobuf map) in key order, so a payload
        # has one key however its map was built or copied (without it, the
        # same payload was stored twice under two keys, by map order).
        blobs = [p.SerializeToString(deterministic=True) for p in payloads]
        keys = [hashlib.sha256(b).hexdigest() for b in blobs]
        await asyncio.to_thread(self._write, keys, blobs, owner)
        return [StorageDriverClaim(claim_data={"sha256": k, "size": str(len(b))})
                for k, b in zip(keys, blobs, strict=True)]

    def _write(self, keys: list[str], blobs: list[bytes], owner: str) -> None:
        with self.db.connect() as conn:
            for key, data in zip(keys, blobs, strict=True):
                conn.insert_new(payload_blob, {"key": key, "data": data, "size": len(data),
                                               "created_at": now_iso()})
                conn.insert_new(payload_ref, {"key": key, "workflow_id": owner})

    async def retrieve(self, context: StorageDriverRetrieveContext,
                       claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        keys = [c.claim_data["sha256"] for c in claims]
        rows = await asyncio.to_thread(self._read, keys)
        out = []
        for key in keys:
            data = rows.get(key)
            if data is None:
                raise PayloadIntegrityError(f"payload {key} is missing from payload_blob")
            if hashlib.sha256(data).hexdigest() != key:
                raise PayloadIntegrityError(f"payload {key} does not match its hash")
            out.append(Payload.FromString(data))
        return out

    def _read(self, keys: list[str]) -> dict[str, bytes]:
        with self.db.connect() as conn:
            found = conn.rows(sa.select(blob.key, blob.data).where(blob.key.in_(set(keys))),
                              Blob)
        return {b.key: bytes(b.data) for b in found}


def data_converter(db: Database, base: DataConverter,
                   threshold: int = DEFAULT_THRESHOLD) -> DataConverter:
    storage = ExternalStorage(drivers=[DatabasePayloadDriver(db)],
                              payload_size_threshold=threshold)
    return dataclasses.replace(base, external_storage=storage)


async def sweep(db: Database, client: Client, grace: timedelta = timedelta(hours=1)) -> int:
    """Delete blobs that no running or retained workflow references; returns
    how many blobs were deleted. A workflow the server no longer knows (past
    its namespace retention) releases its references; unreferenced blobs
    older than `grace` go (the grace covers a payload stored by a client
    whose workflow start is still in flight)."""
    with db.connect() as conn:
        owners = conn.scalars(sa.select(ref.workflow_id).distinct(), str)
    gone = []
    for wf_id in owners:
        if wf_id == "?":
            continue
        try:
            await client.get_workflow_handle(wf_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                gone.append(wf_id)
            else:
                raise
    cutoff = (datetime.now(UTC) - grace).isoformat(timespec="milliseconds")
    with db.connect() as conn:
        for wf_id in gone:
            conn.execute(sa.delete(payload_ref).where(ref.workflow_id == wf_id))
        cur = conn.execute(sa.delete(payload_blob).where(
            blob.created_at < cutoff, blob.key.not_in(sa.select(ref.key))))
        deleted = int(cur.rowcount)
    log.info("payload sweep: %d workflow(s) released, %d blob(s) deleted", len(gone), deleted)
    return deleted
