"""The sales app as the runtime receives it (turnstile.runtime.apps.App):
its service, its tables and their privileges, its offline demo script and
the local SMTP server `make up` runs for it. worker.py, starter.py and
`python -m turnstile.db` pass `build_sales_app()` on; nothing else does."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from turnstile import App, BackgroundContext, Database, DevService, OutboundPolicy, Settings
from turnstile.sales.planner import SalesScript
from turnstile.sales.schema import TABLES
from turnstile.sales.service import (
    DEFAULT_OUTBOUND,
    build_compact_sales_service,
    build_sales_service,
)

LOCAL_HOSTS = ("localhost", "127.0.0.1")


def dev_services(settings: Settings) -> Sequence[DevService]:
    """The local SMTP server (turnstile.sales.smtp_server), writing each mail
    under .data/mail, when SMTP_HOST is this machine."""
    if settings.smtp_host not in LOCAL_HOSTS:
        return ()
    command = [sys.executable, "-m", "turnstile.sales.smtp_server",
               "--port", str(settings.smtp_port), "--dir", str(settings.data_dir / "mail")]
    return (DevService("smtp", command, settings.smtp_host, settings.smtp_port),)


def run_email_sender(ctx: BackgroundContext) -> None:
    """The e-mail sender (turnstile.sales.sender): delivers queued mails until
    the worker stops."""
    from turnstile.sales.sender import SenderConfig, run_sender

    config = SenderConfig(stale_after_seconds=ctx.settings.sender_stale_seconds,
                          metric_meter=ctx.metric_meter)
    run_sender(ctx.db, ctx.settings, ctx.stop, 0.5, config)


def seed_sales(db: Database, rows: int | None) -> str:
    from turnstile.sales.seed import seed

    n = seed(db, rows=5000 if rows is None else rows)
    return f"seeded {n} sales records into {db.dialect}"


def build_sales_app(outbound: OutboundPolicy = DEFAULT_OUTBOUND) -> App:
    # The first service is the default; sales-compact is the same scenario for
    # small local models (docs/sales.md).
    return App(name="sales", services=(build_sales_service(outbound),
                                       build_compact_sales_service(outbound)), tables=TABLES,
               demo_script=SalesScript(), dev_services=dev_services,
               background={"e-mail sender": run_email_sender}, seed=seed_sales)
