"""Operator commands for the database of DATABASE_URL:

    python -m turnstile.db upgrade    # migrate to the newest schema (the worker does it too)
    python -m turnstile.db current    # the revision the database is at, and the newest one
"""

from __future__ import annotations

import argparse
import logging
import sys

import turnstile.sales.schema  # noqa: F401  (the reference app's tables: reader grants)
from turnstile.runtime.config import Settings
from turnstile.stores.db import Database, dispose_engines
from turnstile.stores.schema import current, head_revision, upgrade


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turnstile.db", description=__doc__)
    parser.add_argument("command", choices=["upgrade", "current"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
    try:
        if args.command == "upgrade":
            before = current(db)
            after = upgrade(db)
            sys.stdout.write(
                f"database ({db.dialect}) upgraded: {before or 'no revision'} -> {after}\n")
        else:
            sys.stdout.write(f"database ({db.dialect}) at {current(db) or 'no revision'}; "
                             f"newest {head_revision()}\n")
    finally:
        dispose_engines()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
