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
- `seed`: what `starter.py seed` (and so `make run`) puts in its tables.
- `background`: blocking functions the worker runs, each in a thread of its
  own, until `BackgroundContext.stop` is set (the sales app's e-mail sender).

Which apps a worker serves: TURNSTILE_APPS (`load_apps`), comma-separated
`module:attribute`, each an `App` or a function returning one; unset: the
reference app (`turnstile.sales.app:build_sales_app`). The first service of
the first app is the default service of a turn that names none.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from turnstile.engine.errors import ConfigurationError
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
class BackgroundContext:
    """What a background process of an app runs against."""

    db: Any  # the worker's turnstile.stores.db.Database
    settings: Settings
    stop: threading.Event  # set when the worker shuts down: return soon after
    metric_meter: Any = None  # Temporal's metric meter (None: no metrics endpoint)


Background = Callable[[BackgroundContext], None]


@dataclass(frozen=True)
class App:
    name: str
    services: Sequence[Service] = ()
    tables: Sequence[sa.Table] = ()
    demo_script: DemoScript | None = None
    dev_services: Callable[[Settings], Sequence[DevService]] = field(
        default=_no_dev_services)
    background: Mapping[str, Background] = field(default_factory=dict)
    # `starter.py seed` (`make run`): fills the app's demo data in the
    # database (its tables exist), given `--rows` (None: the app's default);
    # returns one line saying what it did.
    seed: Callable[[Any, int | None], str] | None = None


# TURNSTILE_APPS unset: the reference app.
DEFAULT_APPS = ("turnstile.sales.app:build_sales_app",)


class AppLoadError(ConfigurationError):
    """An app or plugin named in the environment cannot be loaded: one line
    saying which, why, and what to check (the programs exit 2 with it)."""

    error_type = "AppLoadError"


def import_named(variable: str, spec: str) -> Any:
    """The attribute `module:attribute` names; AppLoadError when it cannot be had."""
    module_name, _, attribute = spec.strip().partition(":")
    if not module_name or not attribute:
        raise AppLoadError(f"{variable}: {spec.strip()!r} is not module:attribute "
                           "(e.g. examples.support_desk:app)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any failure of the module's own import code is the same answer
        raise AppLoadError(
            f"{variable}: cannot import {spec.strip()!r}: {type(exc).__name__}: {exc} "
            f"(check the import path {module_name!r}: is it importable from "
            f"the working directory or PYTHONPATH?)") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise AppLoadError(f"{variable}: module {module_name!r} has no attribute "
                           f"{attribute!r} (check {spec.strip()!r})") from None


def load_app(spec: str) -> App:
    found = import_named("TURNSTILE_APPS", spec)
    app = found() if callable(found) and not isinstance(found, App) else found
    if not isinstance(app, App):
        raise AppLoadError(f"TURNSTILE_APPS: {spec.strip()!r} is {type(app).__name__}, not an "
                           "App (or a function returning one)")
    return app


def load_apps(settings: Settings) -> list[App]:
    """The apps TURNSTILE_APPS names, in order (unset: the reference app)."""
    apps = [load_app(spec) for spec in settings.apps or DEFAULT_APPS]
    names = [a.name for a in apps]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AppLoadError(f"TURNSTILE_APPS: app(s) {twice} named twice")
    return apps


def tables_by_app(apps: Iterable[App]) -> dict[str, Sequence[sa.Table]]:
    """What the migration makes and grants (turnstile.stores.schema.upgrade)."""
    return {app.name: app.tables for app in apps}


def services_of(apps: Iterable[App]) -> list[Service]:
    return [service for app in apps for service in app.services]


def tables_of(apps: Iterable[App]) -> list[sa.Table]:
    return [table for app in apps for table in app.tables]


def demo_scripts_of(apps: Iterable[App]) -> list[DemoScript]:
    return [app.demo_script for app in apps if app.demo_script is not None]


def dev_services_of(apps: Iterable[App], settings: Settings) -> list[DevService]:
    return [service for app in apps for service in app.dev_services(settings)]
