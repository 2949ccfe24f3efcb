"""The sales app as the runtime receives it (turnstile.runtime.apps.App):
its service, its tables and their privileges, its offline demo script and
the local SMTP server `make up` runs for it. worker.py, starter.py and
`python -m turnstile.db` pass `build_sales_app()` on; nothing else does."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from turnstile.engine.approvals import OutboundPolicy
from turnstile.runtime.apps import App, DevService
from turnstile.runtime.config import Settings
from turnstile.sales.planner import SalesScript
from turnstile.sales.schema import TABLES
from turnstile.sales.service import DEFAULT_OUTBOUND, build_sales_service

LOCAL_HOSTS = ("localhost", "127.0.0.1")


def dev_services(settings: Settings) -> Sequence[DevService]:
    """The local SMTP server (turnstile.sales.smtp_server), writing each mail
    under .data/mail, when SMTP_HOST is this machine."""
    if settings.smtp_host not in LOCAL_HOSTS:
        return ()
    command = [sys.executable, "-m", "turnstile.sales.smtp_server",
               "--port", str(settings.smtp_port), "--dir", str(settings.data_dir / "mail")]
    return (DevService("smtp", command, settings.smtp_host, settings.smtp_port),)


def build_sales_app(outbound: OutboundPolicy = DEFAULT_OUTBOUND) -> App:
    return App(name="sales", services=(build_sales_service(outbound),), tables=TABLES,
               demo_script=SalesScript(), dev_services=dev_services)
