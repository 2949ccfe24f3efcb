"""The sales app as the runtime receives it (turnstile.runtime.apps.App):
its service, its tables and their privileges, its offline demo script, and
the public outbox's sender and local SMTP server (turnstile.outbox, on
`email_task`: EMAIL_OUTBOX). worker.py, starter.py and
`python -m turnstile.db` pass `build_sales_app()` on; nothing else does."""

from __future__ import annotations

from turnstile import App, Database, OutboundPolicy
from turnstile.sales.planner import SalesScript
from turnstile.sales.schema import EMAIL_OUTBOX, TABLES
from turnstile.sales.service import (
    DEFAULT_OUTBOUND,
    build_compact_sales_service,
    build_sales_service,
)


def seed_sales(db: Database, rows: int | None) -> str:
    from turnstile.sales.seed import seed

    n = seed(db, rows=5000 if rows is None else rows)
    return f"seeded {n} sales records into {db.dialect}"


def build_sales_app(outbound: OutboundPolicy = DEFAULT_OUTBOUND) -> App:
    # The first service is the default; sales-compact is the same scenario for
    # small local models (docs/sales.md).
    return App(name="sales", services=(build_sales_service(outbound),
                                       build_compact_sales_service(outbound)), tables=TABLES,
               demo_script=SalesScript(), dev_services=EMAIL_OUTBOX.dev_services,
               background=EMAIL_OUTBOX.background, seed=seed_sales)
