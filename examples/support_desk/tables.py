"""The desk's own tables: made by the worker when missing (an app's tables,
turnstile.runtime.apps), never by hand."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

desk_order = sa.Table(
    "desk_order", metadata,
    sa.Column("order_id", sa.Text, primary_key=True),
    sa.Column("customer", sa.Text, nullable=False),
    sa.Column("amount_cents", sa.BigInteger, nullable=False),
    sa.Column("status", sa.Text, nullable=False),  # PAID | REFUNDED
)

# One row per refund; `call_key` (the tool call's idempotency key) makes a
# call that runs again find its refund instead of paying twice.
desk_refund = sa.Table(
    "desk_refund", metadata,
    sa.Column("refund_id", sa.Text, primary_key=True),
    sa.Column("call_key", sa.Text, nullable=False, unique=True),
    sa.Column("order_id", sa.Text, nullable=False),
    sa.Column("amount_cents", sa.BigInteger, nullable=False),
    sa.Column("status", sa.Text, nullable=False),  # PAID_OUT | REVERSED
)

TABLES = (desk_order, desk_refund)

DEMO_ORDERS = [
    {"order_id": "A-1001", "customer": "Ada Lovelace", "amount_cents": 2_500, "status": "PAID"},
    {"order_id": "A-1002", "customer": "Alan Turing", "amount_cents": 48_000, "status": "PAID"},
]
