"""Payloads above Temporal's 2 MiB limit: claim-checked, the turn completes.

Measured without this (docs/design.md, "Measured Temporal facts"): an
oversized activity input leaves the workflow Running, retrying its workflow
task every ~10 s forever."""

from __future__ import annotations

import hashlib

import pytest
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.sql import fetchall, fetchone
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.runtime.client import converter
from turnstile.runtime.config import Settings
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.stores.payload_store import PayloadIntegrityError, sweep
from turnstile.stores.schema import ensure_schema
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MB = 1024 * 1024


async def test_ten_megabyte_tool_result_and_huge_answer_complete_the_turn(
        temporal_server: DevServer, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    settings = Settings.from_env({"DATABASE_URL": url})
    ensure_schema(Database(url))
    client = await Client.connect(temporal_server.address, data_converter=converter(settings))
    huge_args = {"text": "a" * (3 * MB)}  # tool arguments above the limit
    answer = "b" * (3 * MB)  # a model answer above the limit
    fake_llm.script(tool_reply(("big", "bigResult", {"megabytes": 10})),
                    tool_reply(("e", "echo", huge_args)), text_reply(answer))
    async with running_worker(client, task_queue, url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("make it big", conversation="c-big")
        result = await handle.result()
        stored = MemoryStore(turns.rt.db).messages("c-big")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == answer
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 2
    # The 10 MB result is whole in memory; the model got it capped (the memory
    # window, tests/test_long_conversations.py); history holds a preview.
    big = next(m for m in stored if m.tool_call_id == "big")
    assert len(big.content or "") == 10 * MB
    sent = fake_llm.requests[1]["messages"][-1]["content"]
    assert sent.startswith("z" * 1000) and "bytes of this bigResult result were left out" in sent
    history = await handle.fetch_history()
    sizes = [e.ByteSize() for e in history.events]
    assert max(sizes) < 64 * 1024 and sum(sizes) < 512 * 1024
    # The oversized payloads were stored under their content hash.
    with turns.rt.db.connect() as conn:
        blobs = fetchall(conn, "SELECT key, size FROM payload_blob")
        refs = fetchall(conn, "SELECT DISTINCT workflow_id FROM payload_ref")
    assert len(blobs) >= 3 and all(b["size"] > 2 * MB for b in blobs)
    assert refs == [{"workflow_id": handle.id}]


async def test_corrupted_blob_is_detected_and_sweep_keeps_live_references(
        temporal_server: DevServer, tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    settings = Settings.from_env({"DATABASE_URL": url})
    db = Database(url)
    ensure_schema(db)
    conv = converter(settings)
    client = await Client.connect(temporal_server.address, data_converter=conv)
    payloads = await conv.encode(["x" * MB])
    key = payloads[0].metadata  # the reference, not the data
    assert key and len(payloads[0].SerializeToString()) < 4096
    with db.connect() as conn:
        row = fetchone(conn, "SELECT key, data FROM payload_blob")
        assert row is not None and hashlib.sha256(bytes(row["data"])).hexdigest() == row["key"]
    assert await conv.decode(payloads, [str]) == ["x" * MB]
    # Nothing references it but the owner "?" here (no workflow): sweep keeps it.
    assert await sweep(db, client) == 0
    with db.connect() as conn:
        conn.execute("UPDATE payload_blob SET data = :data", {"data": b"tampered"})
    with pytest.raises(PayloadIntegrityError, match="does not match its hash"):
        await conv.decode(payloads, [str])
