"""Database errors reach the model, memory and the audit log as a short
category; the driver's text (host, role, SQL) only reaches the log."""

from __future__ import annotations

import logging
import uuid
from urllib.parse import urlparse, urlunparse

import pytest
from temporalio.client import Client

from tests.support.turns import running_worker
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.sales.service import build_sales_service
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


async def test_unreachable_reader_is_a_category_not_driver_text(
        client: Client, task_queue: str, fake_llm: FakeOpenAIServer, postgres_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    role = f"ts_no_such_role_{uuid.uuid4().hex[:8]}"
    parsed = urlparse(postgres_url)
    reader = urlunparse(parsed._replace(netloc=f"{role}@{parsed.hostname}:{parsed.port}"))
    fake_llm.script(
        tool_reply(("q1", "querySalesData", {"startDate": "2026-11-16", "endDate": "2026-11-22",
                                             "minAmount": 50000})),
        text_reply("The sales database is unavailable right now."))
    caplog.set_level(logging.WARNING)
    async with running_worker(client, task_queue, postgres_url, [build_sales_service()],
                              llm_url=fake_llm.url,
                              env={"DATABASE_READONLY_URL": reader}) as turns:
        conversation = f"c-{uuid.uuid4().hex[:8]}"
        handle = await turns.start("sales last week?", service="sales-assistant",
                                   conversation=conversation)
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    [call] = result.tool_calls
    assert (call.status, call.is_error) == (CallStatus.FAILED, True)
    db = Database(postgres_url)
    # What the model was sent for the failed call (the fake server records it),
    # what memory keeps of it, and the audit row.
    sent = fake_llm.requests[-1]["messages"]
    tool_text = next(m["content"] for m in sent if m["role"] == "tool")
    remembered = next(m.content for m in MemoryStore(db).messages(conversation)
                      if m.role == "tool")
    [row] = AuditLog(db).rows(handle.id)
    for text in (tool_text, remembered or "", row.error_message):
        assert "database unavailable" in text and "tried 3 time(s)" in text, text
        assert role not in text and str(parsed.hostname) not in text, text
    # The operator still gets the detail.
    assert any(role in r.getMessage() for r in caplog.records)
