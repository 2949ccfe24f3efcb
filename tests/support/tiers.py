"""Test tiers, marked at collection from what a test needs (no test marks itself):

- `live`: a Temporal dev server (the `temporal_server` or `client` fixture);
- `pg`: PostgreSQL (the `postgres_url` fixture, or the `db` fixture's
  postgresql parameter).

`make test-fast` runs `-m "not live and not pg"`: the pure rules, SQLite
stores, parsers and documents, in about a minute; `make test` runs everything.
"""

from __future__ import annotations

import pytest

LIVE_FIXTURES = {"temporal_server", "client"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live: needs a Temporal dev server")
    config.addinivalue_line("markers", "pg: needs PostgreSQL at 127.0.0.1:5432")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & LIVE_FIXTURES:
            item.add_marker(pytest.mark.live)
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if "postgres_url" in names or "postgres_database_factory" in names \
                or "postgresql" in params:
            item.add_marker(pytest.mark.pg)
