"""Raw SQL reads for tests and benchmarks that check tables directly.

Product code reads rows through the typed reads of
`turnstile.stores.connection.Connection` (`rows`, `row`, `scalars`, `scalar`); these
helpers give a test the rows of any SQL text (or Core statement) as dicts,
so that a check can compare whole rows at a glance. They do not count in
`turnstile.stores.connection.rows_read` (the product's reads do).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnstile.stores.connection import Connection, Statement


def fetchall(conn: Connection, sql: Statement,
             params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every row of `sql` (named parameters `:name`), each as a dict."""
    return [dict(r) for r in conn.execute(sql, params).mappings()]


def fetchone(conn: Connection, sql: Statement,
             params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The first row of `sql` as a dict, or None."""
    row = conn.execute(sql, params).mappings().first()
    return None if row is None else dict(row)
