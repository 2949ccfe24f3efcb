"""The process-wide SQLAlchemy engines, one per database URL (and one per
read-only connection): the URL forms, the driver, SQLite's connection set-up
and its read-only connection."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlparse, urlunparse

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from turnstile.extras import require_extra

Dialect = Literal["sqlite", "postgresql"]

# The SELECT-only role of the read-only connection on PostgreSQL.
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


def sqlalchemy_url(url: str) -> str:
    """The documented DATABASE_URL forms, with the driver the project uses."""
    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        require_extra("postgres", "A PostgreSQL DATABASE_URL")
        return f"postgresql+psycopg://{rest}"
    if scheme == "sqlite" and sep:
        return url
    raise ValueError(
        f"unsupported DATABASE_URL scheme {scheme!r}: "
        "use sqlite:///ABSOLUTE/PATH or postgresql://USER@HOST:PORT/DB"
    )


_engines: dict[tuple[str, bool], Engine] = {}
_engines_lock = threading.Lock()


def _sqlite_setup(dbapi_conn: Any, _record: Any) -> None:
    # PRAGMAs (and BEGIN IMMEDIATE below) have no SQLAlchemy expression: they
    # go to the driver as text.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


# What the read-only SQLite connection may do: read, and nothing else.
_READ_ACTIONS = frozenset({
    sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE, sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT,
})


def _read_only_authorizer(action: int, arg1: str | None, arg2: str | None,
                          _db: str | None, _trigger: str | None) -> int:
    if action in _READ_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and arg2 is None:
        return sqlite3.SQLITE_OK  # reading a pragma; setting one is refused
    return sqlite3.SQLITE_DENY  # ATTACH, DETACH, writes, DDL, setting pragmas


def _sqlite_reader(path: Path) -> sqlite3.Connection:
    # One leading slash ("sqlite:////abs" gives "//abs", which a file: URI
    # would read as a host) and quoted ("?", "#", "%").
    uri = f"file:{quote('/' + path.as_posix().lstrip('/'))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=30000")
    conn.execute("PRAGMA query_only=1")
    conn.set_authorizer(_read_only_authorizer)
    return conn


def _make_engine(url: str, readonly: bool, readonly_url: str | None) -> Engine:
    target = sqlalchemy_url(url)
    if target.startswith("sqlite"):
        path = Path(urlparse(url).path)
        if readonly:
            return sa.create_engine("sqlite://", creator=lambda: _sqlite_reader(path),
                                    poolclass=sa.QueuePool, pool_size=5, max_overflow=10,
                                    hide_parameters=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(target, pool_size=5, max_overflow=10,
                                  connect_args={"timeout": 30}, hide_parameters=True)
        event.listen(engine, "connect", _sqlite_setup)
        return engine
    if readonly:
        target = sqlalchemy_url(readonly_url or reader_url(url))
    engine = sa.create_engine(
        target, pool_size=5, max_overflow=10, pool_recycle=1800,
        connect_args={"connect_timeout": 10},
        # A statement's values (addresses, arguments) never reach a log line.
        hide_parameters=True,
    )
    if readonly:
        engine = engine.execution_options(postgresql_readonly=True)
    return engine


def engine_for(url: str, *, readonly: bool = False, readonly_url: str | None = None) -> Engine:
    """The process-wide engine of `url` (or of its read-only connection)."""
    key = (f"{url}|{readonly_url or ''}" if readonly else url, readonly)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _make_engine(url, readonly, readonly_url)
        return engine


def dispose_engines() -> None:
    """Close every pooled connection of this process (tests, shutdown)."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.dispose()

