"""What an application hands the runtime: an `App`.

An app (the reference one is turnstile.sales: `build_sales_app()`) is built
by its own package and passed explicitly by the programs that run it —
worker.py, starter.py, `python -m turnstile.db` —; nothing below the app
imports it, and no import registers anything as a side effect.

- `services`: what the worker serves.
- `tables`: the app's tables (`sa.Table`s on a MetaData of its own). The
  migrations (turnstile/migrations) make them; the upgrade re-applies the
  privileges their `info` names after every run (turnstile.stores.schema):
  `info={"reader": True}` — the read-only role may SELECT it;
  `info={"grants": {role: "SELECT, INSERT"}}` — what each tool role may do.
- `demo_script`: how the offline demo planner plays the app's scenario
  (turnstile.providers.demo_planner) when no model is configured.
- `dev_services`: the processes `make up` runs for it (e.g. a local SMTP
  server), given the settings (turnstile.runtime.devstack).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

from turnstile.providers.demo_planner import DemoScript
from turnstile.runtime.config import Settings
from turnstile.runtime.services import Service


@dataclass(frozen=True)
class DevService:
    """A process of the dev stack: up once something answers at host:port."""

    name: str  # its pid file and log under .data/ (not "temporal", not "worker...")
    command: Sequence[str]
    host: str
    port: int
    start_seconds: float = 20.0  # how long it may take to answer


def _no_dev_services(_settings: Settings) -> Sequence[DevService]:
    return ()


@dataclass(frozen=True)
class App:
    name: str
    services: Sequence[Service] = ()
    tables: Sequence[sa.Table] = ()
    demo_script: DemoScript | None = None
    dev_services: Callable[[Settings], Sequence[DevService]] = field(
        default=_no_dev_services)


def services_of(apps: Iterable[App]) -> list[Service]:
    return [service for app in apps for service in app.services]


def tables_of(apps: Iterable[App]) -> list[sa.Table]:
    return [table for app in apps for table in app.tables]


def demo_scripts_of(apps: Iterable[App]) -> list[DemoScript]:
    return [app.demo_script for app in apps if app.demo_script is not None]


def dev_services_of(apps: Iterable[App], settings: Settings) -> list[DevService]:
    return [service for app in apps for service in app.dev_services(settings)]
