"""Bounded queries through a real turn: a test-only tool runs a really slow
statement (pg_sleep on PostgreSQL; a long recursive query on SQLite, stopped
by the progress handler) under a 0.3 s statement timeout. Each attempt is
stopped by the database, Temporal retries it per the tool's policy, and the
model is told "the query took too long"."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from temporalio.client import Client

from tests.support.turns import running_worker
from tests.test_tool_semantics import attempts, tool_messages
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.specs import RetrySpec
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolContext, ToolRegistry, tool
from turnstile.sales.access import tool_connection
from turnstile.stores.audit import AuditLog
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

SLOW = {
    "postgresql": "SELECT pg_sleep(20)",
    "sqlite": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n"
              " WHERE i < 2000000000) SELECT COUNT(*) FROM n",
}


@tool(idempotent=True, statement_timeout_seconds=0.3,
      retry=RetrySpec(maximum_attempts=2, initial_interval_seconds=0.1))
def slowReport(ctx: ToolContext) -> str:  # noqa: N802 (a tool name the model sees)
    """A report whose query is far too slow (test-only)."""
    with tool_connection(ctx.db, None, readonly=True,
                         timeout_seconds=ctx.statement_timeout_seconds) as conn:
        conn.execute(SLOW[conn.dialect])
    return "done"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/t.db"
    else:
        with request.getfixturevalue("postgres_database_factory")() as pg_url:
            yield pg_url


async def test_slow_query_is_stopped_retried_and_reported(client: Client, task_queue: str,
                                                          url: str,
                                                          fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("c1", "slowReport", {})), text_reply("the report is too slow"))
    service = Service(name="slow", system_prompt="You run reports.",
                      tools=ToolRegistry([slowReport]))
    async with running_worker(client, task_queue, url, [service], llm_url=fake_llm.url) as turns:
        began = time.monotonic()
        handle = await turns.start("run the report", service="slow")
        result = await handle.result()
        took = time.monotonic() - began
        audit = AuditLog(turns.rt.db).rows(handle.id)
    assert result.status == TurnStatus.COMPLETED
    call = result.tool_calls[0]
    assert (call.status, call.is_error) == (CallStatus.FAILED, True)
    assert await attempts(handle) == [2]  # retried by the tool's policy, then reported
    told = tool_messages(fake_llm.requests[1])[0]["content"]
    assert "the query took too long (over 0.3 s)" in told
    assert [r.status for r in audit] == ["FAILED"]
    assert "took too long" in audit[0].error_message
    assert took < 10, took  # two attempts of 0.3 s, not of a 20 s statement
