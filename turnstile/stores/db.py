"""One database code path for SQLite (default) and PostgreSQL (DATABASE_URL).

SQL in this project is written once, with `?` placeholders; the PostgreSQL
connection rewrites them to `%s` for psycopg. Dialect differences that SQL
cannot hide (auto-increment keys, timestamp types) are spelled out in the DDL
of the module that owns each table, keyed by `Database.dialect`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlparse, urlunparse

from turnstile.engine.errors import DatabaseUnavailable

Dialect = Literal["sqlite", "postgresql"]

# Each module that owns tables registers a function returning its DDL
# statements for a dialect; `turnstile.stores.schema.ensure_schema` runs them all.
SchemaProvider = Callable[[Dialect], Sequence[str]]
_schema_providers: list[SchemaProvider] = []


def schema(provider: SchemaProvider) -> SchemaProvider:
    """Register a DDL provider (decorator). Statements must be idempotent."""
    _schema_providers.append(provider)
    return provider


def registered_schema() -> list[SchemaProvider]:
    return list(_schema_providers)


# The SELECT-only role created by turnstile.sales.schema on PostgreSQL.
READER_ROLE = "turnstile_reader"


def reader_url(url: str) -> str:
    """DATABASE_URL with the user replaced by the read-only role (same host,
    port, database and query; no password). Used for `connect(readonly=True)`
    when no DATABASE_READONLY_URL is given; a server that requires passwords
    needs that variable instead."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{READER_ROLE}@{host}" + (f":{parsed.port}" if parsed.port else "")
    return urlunparse(parsed._replace(netloc=netloc))


class Connection:
    """A thin DB-API wrapper: `?` placeholders on both backends, rows as dicts."""

    def __init__(self, raw: Any, dialect: Dialect) -> None:
        self.raw = raw
        self.dialect = dialect

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.dialect == "postgresql" else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = self.raw.cursor()
        cur.execute(self._sql(sql), tuple(params))
        return cur

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        cur = self.raw.cursor()
        cur.executemany(self._sql(sql), [tuple(r) for r in rows])

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self.execute(sql, params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        rows = self.fetchall(sql, params)
        return rows[0] if rows else None


class Database:
    """Connection factory for one DATABASE_URL."""

    def __init__(self, url: str, *, readonly_url: str | None = None) -> None:
        self.url = url
        parsed = urlparse(url)
        if parsed.scheme == "sqlite":
            self.dialect: Dialect = "sqlite"
            # sqlite:///ABSOLUTE/PATH -> path "/ABSOLUTE/PATH"
            self.path = Path(parsed.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif parsed.scheme in ("postgresql", "postgres"):
            self.dialect = "postgresql"
        else:
            raise ValueError(
                f"unsupported DATABASE_URL scheme {parsed.scheme!r}: "
                "use sqlite:///ABSOLUTE/PATH or postgresql://USER@HOST:PORT/DB"
            )
        self.readonly_url = readonly_url

    def __repr__(self) -> str:
        return f"Database({self.dialect})"

    def _open(self, *, readonly: bool) -> Any:
        try:
            if self.dialect == "sqlite":
                if readonly:
                    # One leading slash ("sqlite:////abs" gives "//abs", which a
                    # file: URI would read as a host) and quoted ("?", "#", "%").
                    uri = f"file:{quote('/' + self.path.as_posix().lstrip('/'))}?mode=ro"
                    raw = sqlite3.connect(uri, uri=True, timeout=30)
                else:
                    raw = sqlite3.connect(self.path, timeout=30)
                    raw.execute("PRAGMA journal_mode=WAL")
                    raw.execute("PRAGMA synchronous=NORMAL")
                raw.execute("PRAGMA busy_timeout=30000")
                return raw
            import psycopg

            url = self.url
            if readonly:
                url = self.readonly_url or reader_url(self.url)
            pg: Any = psycopg.connect(url, connect_timeout=10)
            if readonly:
                pg.read_only = True
            return pg
        except sqlite3.OperationalError as exc:
            raise DatabaseUnavailable(f"cannot open SQLite database {self.path}: {exc}") from exc
        except Exception as exc:  # psycopg.OperationalError and friends
            if type(exc).__module__.startswith("psycopg"):
                raise DatabaseUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
            raise

    @contextmanager
    def connect(self, *, readonly: bool = False) -> Iterator[Connection]:
        """A connection in one transaction: committed on success, rolled back on error."""
        raw = self._open(readonly=readonly)
        try:
            conn = Connection(raw, self.dialect)
            yield conn
            raw.commit()
        except BaseException:
            raw.rollback()
            raise
        finally:
            raw.close()
