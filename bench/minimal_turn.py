"""The floor of bench/turns.py: a hand-written turn of exactly the model and
tool activities a turn needs, nothing else.

`MinimalTurn` keeps the conversation in the workflow, asks the model (one
activity per request: the same HTTP call to the same OpenAI-compatible
endpoint, with Turnstile's own `querySalesData` schema) and runs each tool
call as one activity doing the same query (`turnstile.sales.query.run_sales_query`
on a read-only pooled connection of the same database). No memory, audit,
ledger, lock, pipeline or events: what durability on Temporal costs at least.

The worker side reads BENCH_LLM_URL and DATABASE_URL (bench/turn_workers.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import cache
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import httpx

    from turnstile.sales.query import run_sales_query
    from turnstile.sales.sales_tools import querySalesData
    from turnstile.stores.db import Database

SYSTEM = "You are a sales assistant. Use querySalesData to answer."
TOOLS = [querySalesData.spec.openai_schema()]
MAX_ROUNDS = 10


@cache
def _http() -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=os.environ["BENCH_LLM_URL"], timeout=120)


@cache
def _db() -> Database:
    return Database(os.environ["DATABASE_URL"])


@activity.defn(name="minimal.call_model")
async def call_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    response = await _http().post("/chat/completions", json={
        "model": "fake", "messages": messages, "tools": TOOLS})
    response.raise_for_status()
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


def _query(arguments: str) -> str:
    args = json.loads(arguments)
    with _db().connect(readonly=True) as conn:
        result = run_sales_query(conn, date.fromisoformat(args["startDate"]),
                                 date.fromisoformat(args["endDate"]),
                                 Decimal(str(args["minAmount"])),
                                 today=datetime.now(UTC).date())
    return result.model_dump_json(exclude_none=True)


@activity.defn(name="minimal.query_sales")
async def query_sales(arguments: str) -> str:
    return await asyncio.to_thread(_query, arguments)


@workflow.defn(name="MinimalTurn")
class MinimalTurn:
    @workflow.run
    async def run(self, message: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": message}]
        retry = RetryPolicy(initial_interval=timedelta(seconds=1))
        for _ in range(MAX_ROUNDS):
            reply: dict[str, Any] = await workflow.execute_activity(
                call_model, messages, start_to_close_timeout=timedelta(seconds=180),
                retry_policy=retry)
            # Sent back with text, never null: every server takes "" (some refuse null).
            messages.append({**reply, "content": reply.get("content") or ""})
            calls = reply.get("tool_calls") or []
            if not calls:
                return str(reply.get("content") or "")
            for call in calls:
                result: str = await workflow.execute_activity(
                    query_sales, call["function"]["arguments"],
                    start_to_close_timeout=timedelta(seconds=30), retry_policy=retry)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        raise ApplicationError(f"more than {MAX_ROUNDS} rounds", non_retryable=True)
