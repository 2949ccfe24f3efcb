"""The desk as the worker receives it: one service, its tables, its demo data."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from examples.support_desk.model import MODEL
from examples.support_desk.tables import DEMO_ORDERS, TABLES, desk_order
from examples.support_desk.tools import issueRefund, lookupOrder
from turnstile import App, Database, ModelSettings, Service, ToolRegistry

SYSTEM_PROMPT = """\
You are a support desk agent. Look an order up with lookupOrder before anything
else. Refund with issueRefund; above $100.00 (10000 cents) a person approves it
first. Say what you did, with the refund id."""

# What each request to a real model (LLM_BASE_URL set) asks besides the
# conversation; the offline function model does not read it.
# - max_tokens: a reply here is one tool call or a sentence with a refund id,
#   so 512 is ample; the bound stops a runaway reply from holding the turn (a
#   reply cut there gets one continuation, then the turn ends `truncated`).
# - temperature: low, so the same request gets the same tool and the same
#   kind of answer (OpenAI's default is 1, llama-server's 0.8).
# - tool_choice stays "auto": forcing lookupOrder would make the model invent
#   an order id for "hello" or "where is my order?"; it should ask instead.
# - schema_dialect stays unset: the worker's LLM_SCHEMA_DIALECT (default
#   "grammar") sends OrderId without its `pattern`, which llama.cpp's servers
#   accept; the tool still validates it, and an id that breaks it goes back to
#   the model as an argument error.
# - documents: the desk has none, so retrieval does not run anyway;
#   text_tool_calls / tool_results="text" are for servers whose chat template
#   mishandles tool calls (docs/local-models.md), not for the desk as such.
MODEL_SETTINGS = ModelSettings(max_tokens=512, temperature=0.2)


def seed(db: Database, rows: int | None) -> str:
    """The demo orders (again as new: PAID), for `starter.py seed` / `make run`."""
    with db.connect() as conn:
        conn.execute(sa.delete(desk_order))
        for order in DEMO_ORDERS:
            conn.execute(sa.insert(desk_order).values(**order))
    return f"{len(DEMO_ORDERS)} demo orders (A-1001: $25.00, A-1002: $480.00)"


def build_app(*, model: ModelSettings = MODEL_SETTINGS, **service: Any) -> App:
    """The desk; `model` and `service` (more `Service` fields) change its service."""
    return App(
        name="support-desk",
        services=[Service(name="support-desk", tools=ToolRegistry(
            [lookupOrder, issueRefund]), system_prompt=SYSTEM_PROMPT,
            description="Look up orders and refund them", offline_model=MODEL,
            model=model, **service)],
        tables=TABLES,
        seed=seed,
    )


app = build_app()
