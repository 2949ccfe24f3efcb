"""The desk as the worker receives it: one service, its tables, its demo data."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from examples.support_desk.model import MODEL
from examples.support_desk.tables import DEMO_ORDERS, TABLES, desk_order
from examples.support_desk.tools import issueLargeRefund, issueRefund, lookupOrder
from turnstile import App, Database, Service, ToolRegistry

SYSTEM_PROMPT = """\
You are a support desk agent. Look an order up with lookupOrder before anything
else. Refund with issueRefund up to $100.00 (10000 cents); above that use
issueLargeRefund, which a person approves. Say what you did, with the refund id."""


def seed(db: Database, rows: int | None) -> str:
    """The demo orders (again as new: PAID), for `starter.py seed` / `make run`."""
    with db.connect() as conn:
        conn.execute(sa.delete(desk_order))
        for order in DEMO_ORDERS:
            conn.execute(sa.insert(desk_order).values(**order))
    return f"{len(DEMO_ORDERS)} demo orders (A-1001: $25.00, A-1002: $480.00)"


def build_app(**service: Any) -> App:
    return App(
        name="support-desk",
        services=[Service(name="support-desk", tools=ToolRegistry(
            [lookupOrder, issueRefund, issueLargeRefund]), system_prompt=SYSTEM_PROMPT,
            description="Look up orders and refund them", offline_model=MODEL, **service)],
        tables=TABLES,
        seed=seed,
    )


app = build_app()
