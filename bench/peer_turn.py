"""The peer of bench/turns.py: pydantic-ai's `TemporalAgent` (pydantic-ai-slim
2.68.0, `make bench-install`) doing the same turn.

The agent asks the same scripted OpenAI-compatible model over HTTP
(`OpenAIChatModel` with `OpenAIProvider(base_url=BENCH_LLM_URL)`) and has one
tool, `querySalesData`, doing the same query as Turnstile's
(`turnstile.sales.query.run_sales_query` on a read-only pooled connection of
DATABASE_URL). TemporalAgent runs each model request and each tool call as an
activity; `PeerTurn` is the workflow around it.

TemporalAgent is deprecated in 2.68 in favour of the `TemporalDurability`
capability; it is what the issue names and still the documented wrapper.

The agent is built when this module is first imported, from the environment
of the worker process (bench/turn_workers.py); the workflow module imports it
passed through the sandbox, so the sandbox sees the same object.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from temporalio.workflow import ActivityConfig

from turnstile.sales.query import run_sales_query
from turnstile.stores.db import Database

SYSTEM = "You are a sales assistant. Use querySalesData to answer."

_db = Database(os.environ["DATABASE_URL"])
_model = OpenAIChatModel(
    "fake", provider=OpenAIProvider(base_url=os.environ["BENCH_LLM_URL"], api_key="bench"))
agent = Agent(_model, name="sales_peer", instructions=SYSTEM)


def _query(start: date, end: date, min_amount: Decimal) -> dict[str, Any]:
    with _db.connect(readonly=True) as conn:
        result = run_sales_query(conn, start, end, min_amount, today=datetime.now(UTC).date())
    return result.model_dump(exclude_none=True)


@agent.tool_plain
async def querySalesData(startDate: date, endDate: date, minAmount: float) -> dict[str, Any]:  # noqa: N802,N803
    """Customers whose total sales in [startDate, endDate] exceeded minAmount."""
    return await asyncio.to_thread(_query, startDate, endDate, Decimal(str(minAmount)))


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    temporal_agent = TemporalAgent(
        agent, activity_config=ActivityConfig(start_to_close_timeout=timedelta(seconds=180)))
