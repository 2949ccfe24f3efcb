"""Operator commands for the database of DATABASE_URL:

    python -m turnstile.db upgrade    # migrate to the newest schema (the worker does it too)
    python -m turnstile.db current    # the revision the database is at, and the newest one
    python -m turnstile.db query-window DAYS|off
                                      # PostgreSQL: how many days of sales the query tool's
                                      # role sees (row-level security; 90 after migrating)
    python -m turnstile.db stubs DIR  # for a release before 0.4.0: write stubs of this
                                      # code's newer revisions into its migrations' DIR
                                      # (turnstile/migrations/versions), so it starts on the
                                      # schema this code migrated (compatible revisions only)
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from alembic.script import ScriptDirectory

from turnstile.runtime.apps import App, AppLoadError, load_apps, tables_by_app
from turnstile.runtime.config import Settings
from turnstile.stores.db import Database
from turnstile.stores.engines import dispose_engines
from turnstile.stores.schema import alembic_config, current, head_revision, upgrade
from turnstile.stores.schema_window import NewerSchema, stubs_for


def main(argv: list[str] | None = None, apps: Sequence[App] | None = None) -> int:
    """`apps`: whose tables `upgrade` makes and grants privileges on
    (None: TURNSTILE_APPS, as the worker serves them)."""
    parser = argparse.ArgumentParser(prog="python -m turnstile.db", description=__doc__)
    parser.add_argument("command", choices=["upgrade", "current", "query-window", "stubs"])
    parser.add_argument("days", nargs="?", default=None,
                        help="query-window: a number of days, or `off` (every row); "
                             "stubs: the older install's turnstile/migrations/versions")
    args = parser.parse_args(argv)
    if args.command == "stubs":
        return _stubs(args.days)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
    try:
        if args.command == "query-window":
            return _query_window(db, args.days)
        if args.command == "upgrade":
            try:
                served = load_apps(settings) if apps is None else list(apps)
            except AppLoadError as exc:
                sys.stderr.write(f"error: {exc}\n")
                return 2
            before = current(db)
            try:
                after = upgrade(db, apps=tables_by_app(served))
            except NewerSchema as exc:
                sys.stderr.write(f"error: {exc}\n")
                return 2
            sys.stdout.write(
                f"database ({db.dialect}) upgraded: {before or 'no revision'} -> {after}\n")
        else:
            sys.stdout.write(f"database ({db.dialect}) at {current(db) or 'no revision'}; "
                             f"newest {head_revision()}\n")
    finally:
        dispose_engines()
    return 0


def _stubs(directory: str | None) -> int:
    """Stubs of this code's revisions an older install lacks (schema_window)."""
    if directory is None or not Path(directory).is_dir():
        sys.stderr.write("stubs takes the older install's turnstile/migrations/versions "
                         "directory\n")
        return 2
    target = Path(directory)
    theirs = [m.group(1) for path in target.glob("*.py")
              if (m := re.search(r'^revision = ["\']([^"\']+)["\']', path.read_text(), re.M))]
    try:
        stubs = stubs_for(ScriptDirectory.from_config(alembic_config()), theirs)
    except NewerSchema as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    for name, source in sorted(stubs.items()):
        (target / name).write_text(source)
        sys.stdout.write(f"wrote {target / name}\n")
    if not stubs:
        sys.stdout.write("nothing to write: it knows every revision of this code\n")
    return 0


def _query_window(db: Database, days_text: str | None) -> int:
    from turnstile.sales.access import set_query_window

    if days_text is None or not (days_text == "off" or days_text.isdigit()):
        sys.stderr.write("query-window takes a number of days (e.g. 90) or `off`\n")
        return 2
    if db.dialect != "postgresql":
        sys.stderr.write("query-window is row-level security: PostgreSQL only (SQLite cannot "
                         "restrict rows by role; see docs/sales.md, Least privilege)\n")
        return 2
    days = None if days_text == "off" else int(days_text)
    set_query_window(db, days)
    sys.stdout.write(f"the query tool's role now sees "
                     f"{'every sales row' if days is None else f'the last {days} days'}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
