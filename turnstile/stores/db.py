"""The project's database access, on SQLAlchemy Core (SQLite or PostgreSQL).

- One `Engine` (with its connection pool) per database URL per process,
  shared by every `Database` naming that URL; `DATABASE_URL` keeps its
  documented forms (`sqlite:///ABSOLUTE/PATH`, `postgresql://USER@HOST:PORT/DB`)
  and the project picks the driver: the standard library's `sqlite3`, or
  psycopg 3 (`postgresql+psycopg://`).
- Every table is declared once, as a `Table`, by the module that owns it (the
  stores on `metadata` here; an app on its own, handed over in its App). The schema in
  a database is made by the Alembic migrations of `turnstile_migrations`, never
  by `create_all`.
- SQLite connections are set up by a connect event: WAL, synchronous=NORMAL,
  a 30 s busy timeout, foreign keys on.
- The read-only connection (`connect(readonly=True)`, used by the query tool)
  cannot write: on SQLite the file is opened `mode=ro`, `PRAGMA query_only` is
  set and an authorizer refuses everything but reading (ATTACH of another
  file included); on PostgreSQL it logs in as a SELECT-only role
  (DATABASE_READONLY_URL, or `turnstile_reader` on the same server) in a
  read-only transaction.
- A connection that cannot be opened is a `DatabaseUnavailable` whose message
  is a short category; the driver's text (host, role, SQL) goes to the log only.
- Statements are Core expressions on those tables; rows come back as the
  caller's own types (`Connection.rows(stmt, SomeRow)`: a NamedTuple or
  dataclass whose fields are the selected columns' labels); there is no
  dict-row read (tests that check tables with raw SQL use tests/support/sql.py).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlparse, urlunparse

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult, Engine

from turnstile.engine.errors import DatabaseUnavailable
from turnstile.stores.db_errors import db_error_text

log = logging.getLogger(__name__)

Dialect = Literal["sqlite", "postgresql"]

# Every table of the stores. Owners add theirs at import time
# (`sa.Table("name", metadata, ...)`); nothing here imports an owner.
metadata = sa.MetaData()

# A yes/no column as v0.1 made it: BOOLEAN on PostgreSQL, INTEGER 0/1 on SQLite.
Flag = sa.Integer().with_variant(sa.Boolean(), "postgresql")
FLAG_FALSE = sa.false()  # its server default: FALSE / 0



def text_columns(*names: str, nullable: bool = False) -> list[sa.Column[str]]:
    """Plain TEXT columns (NOT NULL unless `nullable`), in the order named."""
    return [sa.Column(name, sa.Text, nullable=nullable) for name in names]


def stored_time(moment: datetime) -> str:
    """`moment` as the stores write times: ISO-8601 UTC text of one width
    (milliseconds), so that text order is time order."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class TimeWindow:
    """From `since` (included) until `until` (excluded); None: open."""

    since: datetime | None = None
    until: datetime | None = None

    def on(self, column: sa.ColumnElement[str]) -> list[sa.ColumnElement[bool]]:
        """The window as conditions on a column of stored times."""
        out = [] if self.since is None else [column >= stored_time(self.since)]
        return out if self.until is None else [*out, column < stored_time(self.until)]


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
        return f"postgresql+psycopg://{rest}"
    if scheme == "sqlite" and sep:
        return url
    raise ValueError(
        f"unsupported DATABASE_URL scheme {scheme!r}: "
        "use sqlite:///ABSOLUTE/PATH or postgresql://USER@HOST:PORT/DB"
    )


# --- engines -----------------------------------------------------------------

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


# --- statements --------------------------------------------------------------


@lru_cache(maxsize=1024)
def _text(sql: str) -> sa.TextClause:
    return sa.text(sql)


Statement = str | sa.Executable
Params = Mapping[str, Any]
T = TypeVar("T")


class RowsRead:
    """Rows the process's typed reads returned, for tests and
    benchmarks that prove per-turn reads are bounded (bench/long_conversation.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.total += n


rows_read = RowsRead()


class Connection:
    """One connection in one transaction. SQL is a Core statement, or text
    with named parameters (`:name`, SQLAlchemy's `text()`: SQLAlchemy renders
    them in the driver's style). Rows come back as the caller's types
    (`rows`, `row`, `scalars`, `scalar`)."""

    def __init__(self, sa_conn: sa.Connection, dialect: Dialect) -> None:
        self.sa = sa_conn
        self.dialect = dialect

    @property
    def raw(self) -> Any:
        """The driver's own connection (sqlite3 / psycopg), for driver-only
        features: SQLite's progress handler, PostgreSQL's COPY."""
        return self.sa.connection.driver_connection

    def execute(self, sql: Statement, params: Params | None = None) -> CursorResult[Any]:
        stmt = _text(sql) if isinstance(sql, str) else sql
        return self.sa.execute(stmt, dict(params) if params else None)

    def executemany(self, sql: Statement, rows: Sequence[Params]) -> None:
        if rows:
            stmt = _text(sql) if isinstance(sql, str) else sql
            self.sa.execute(stmt, [dict(r) for r in rows])

    def rows(self, stmt: sa.Executable, into: Callable[..., T]) -> list[T]:
        """Every row, each as `into(**columns)` (a NamedTuple or dataclass
        whose fields are the selected columns' names)."""
        rows = [into(**r) for r in self.sa.execute(stmt).mappings()]
        rows_read.add(len(rows))
        return rows

    def row(self, stmt: sa.Executable, into: Callable[..., T]) -> T | None:
        """The first row as `into(**columns)`, or None."""
        row = self.sa.execute(stmt).mappings().first()
        rows_read.add(row is not None)
        return None if row is None else into(**row)

    def scalars(self, stmt: sa.Executable, into: Callable[[Any], T]) -> list[T]:
        """The first column of every row, each as `into(value)` (e.g. `int`)."""
        values = [into(v) for v in self.sa.execute(stmt).scalars()]
        rows_read.add(len(values))
        return values

    def scalar(self, stmt: sa.Executable, into: Callable[[Any], T]) -> T | None:
        """The first column of the first row as `into(value)`; None when there
        is no row or the value is NULL."""
        row = self.sa.execute(stmt).first()
        rows_read.add(row is not None)
        return None if row is None or row[0] is None else into(row[0])

    def _insert(self, table: sa.Table, values: Params) -> postgresql.Insert | sqlite.Insert:
        """INSERT of the dialect, whose ON CONFLICT clauses differ by engine."""
        make = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        return make(table).values(dict(values))

    def insert_new(self, table: sa.Table, values: Params) -> bool:
        """INSERT ... ON CONFLICT (primary key) DO NOTHING; True when the row
        was inserted (RETURNING says so, on either engine). The statement is
        built once per table and engine, the values sent as its parameters
        (constructing it cost ~0.1 ms a row: memory, ledger and audit rows)."""
        if any(isinstance(v, sa.ClauseElement) for v in values.values()):
            key = list(table.primary_key.columns)
            stmt = self._insert(table, values).on_conflict_do_nothing(index_elements=key)
            return self.sa.execute(stmt.returning(key[0])).first() is not None
        return self.sa.execute(_insert_new(self.dialect, table), dict(values)).first() is not None

    def upsert(self, table: sa.Table, values: Params) -> None:
        """INSERT, or on a primary key taken, UPDATE the row's other columns
        to `values`."""
        key = list(table.primary_key.columns)
        names = {col.name for col in key}
        stmt = self._insert(table, values)
        stmt = stmt.on_conflict_do_update(
            index_elements=key, set_={k: stmt.excluded[k] for k in values if k not in names})
        self.sa.execute(stmt)


_INSERTS_NEW: dict[tuple[str, sa.Table], Any] = {}


def _insert_new(dialect: Dialect, table: sa.Table) -> Any:
    """`Connection.insert_new`'s statement for `table`, without values: they
    are bound at execution (SQLAlchemy names the parameters by column and
    caches the compiled form per set of columns)."""
    stmt = _INSERTS_NEW.get((dialect, table))
    if stmt is None:
        key = list(table.primary_key.columns)
        make = postgresql.insert if dialect == "postgresql" else sqlite.insert
        stmt = make(table).on_conflict_do_nothing(index_elements=key).returning(key[0])
        _INSERTS_NEW[(dialect, table)] = stmt  # a race builds the same statement twice
    return stmt


class Database:
    """The database of one DATABASE_URL (and its read-only connection)."""

    def __init__(self, url: str, *, readonly_url: str | None = None) -> None:
        target = sqlalchemy_url(url)  # refuses unknown schemes early
        self.url = url
        self.dialect: Dialect = "sqlite" if target.startswith("sqlite") else "postgresql"
        if self.dialect == "sqlite":
            # sqlite:///ABSOLUTE/PATH -> path "/ABSOLUTE/PATH"
            self.path = Path(urlparse(url).path)
        self.readonly_url = readonly_url

    def __repr__(self) -> str:
        return f"Database({self.dialect})"

    @property
    def engine(self) -> Engine:
        return engine_for(self.url)

    def reader_engine(self) -> Engine:
        return engine_for(self.url, readonly=True, readonly_url=self.readonly_url)

    @contextmanager
    def connect(self, *, readonly: bool = False) -> Iterator[Connection]:
        """A pooled connection in one transaction: committed on success,
        rolled back on error."""
        engine = self.reader_engine() if readonly else self.engine
        try:
            sa_conn = engine.connect()
        except (exc.OperationalError, exc.InterfaceError) as err:
            raise unavailable(err, self.dialect, readonly) from err
        try:
            with sa_conn.begin():
                yield Connection(sa_conn, self.dialect)
        except exc.DBAPIError as err:
            if err.connection_invalidated:
                raise unavailable(err, self.dialect, readonly) from err
            raise
        finally:
            sa_conn.close()


    @contextmanager
    def joined(self, conn: Connection | None) -> Iterator[Connection]:
        """`conn` when the caller holds a transaction (writes join it), else a
        new connection in its own transaction."""
        if conn is not None:
            yield conn
            return
        with self.connect() as own:
            yield own


class Transaction:
    """One connection in one transaction, opened on first use and ended by its
    owner — `commit()` or `release()` — not by a with-block: the call
    journal's transaction of one tool attempt (turnstile.stores.journal),
    which the tool's own statements and the journal's record share.

    On SQLite it begins `BEGIN IMMEDIATE`: the write lock is taken at the
    start, and the driver's autocommit-until-the-first-write (a savepoint
    before any write would otherwise commit at its release) cannot split it.

    Used by one thread at a time (a sync tool's thread, then the activity's).
    `release()` while another thread is inside `use()` — the activity was
    cancelled while its tool still runs in a thread — leaves the rollback to
    that thread, as it leaves; `use()` after `release()` raises
    `TransactionEnded`."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._sa: sa.Connection | None = None
        self._users = 0
        self._used = self._ended = False
        self._lock = threading.Lock()

    @property
    def used(self) -> bool:
        """A statement block was opened in it (it may have ended since)."""
        with self._lock:
            return self._used

    @contextmanager
    def use(self) -> Iterator[Connection]:
        with self._lock:
            if self._ended:
                raise TransactionEnded("this attempt's transaction has ended (the activity "
                                       "was cancelled or finished)")
            if self._sa is None:
                self._sa = self._open()
            self._used = True
            self._users += 1
            sa_conn = self._sa
        try:
            yield Connection(sa_conn, self.db.dialect)
        except exc.DBAPIError as err:
            if err.connection_invalidated:
                raise unavailable(err, self.db.dialect, False) from err
            raise
        finally:
            with self._lock:
                self._users -= 1
                if self._ended and self._users == 0:
                    self._close(commit=False)

    def _open(self) -> sa.Connection:
        try:
            sa_conn = self.db.engine.connect()
        except (exc.OperationalError, exc.InterfaceError) as err:
            raise unavailable(err, self.db.dialect, False) from err
        try:
            sa_conn.begin()
            if self.db.dialect == "sqlite":
                sa_conn.exec_driver_sql("BEGIN IMMEDIATE")
        except exc.DBAPIError as err:
            sa_conn.close()
            if err.connection_invalidated or isinstance(err, exc.OperationalError):
                raise unavailable(err, self.db.dialect, False) from err
            raise
        return sa_conn

    def commit(self) -> None:
        """Commit what ran in it (nothing if nothing did) and end it."""
        with self._lock:
            if self._users:
                raise RuntimeError("commit while a statement block is still open")
            self._ended = True
            self._close(commit=True)

    def release(self) -> None:
        """End it without committing: roll back now, or as the thread still
        inside `use()` leaves. Idempotent; a no-op after `commit()`."""
        with self._lock:
            self._ended = True
            if self._users == 0:
                self._close(commit=False)

    def _close(self, *, commit: bool) -> None:
        sa_conn, self._sa = self._sa, None
        if sa_conn is None:
            return
        try:
            tx = sa_conn.get_transaction()
            if tx is not None and tx.is_active:
                if commit:
                    tx.commit()
                else:
                    tx.rollback()
        finally:
            sa_conn.close()


class TransactionEnded(RuntimeError):
    """A statement block was asked of a Transaction that has ended."""


def unavailable(err: BaseException, dialect: Dialect, readonly: bool) -> DatabaseUnavailable:
    """A short, safe category for the model and memory; the detail is logged."""
    which = "read-only connection" if readonly else "connection"
    log.warning("database %s failed (%s): %s", which, dialect, db_error_text(err))
    return DatabaseUnavailable(f"database unavailable ({dialect} {which} failed)")


def error_category(err: BaseException) -> str | None:
    """A short text for a database error that may reach the model or memory
    (never the driver's message: it can name hosts, roles and SQL), or None
    when `err` is not a database error."""
    if isinstance(err, DatabaseUnavailable):
        return str(err)
    if isinstance(err, exc.DBAPIError):
        if err.connection_invalidated or isinstance(err, exc.OperationalError | exc.InterfaceError):
            return "database unavailable"
        if isinstance(err, exc.IntegrityError):
            return "the database refused the change (a constraint)"
        return f"database error ({type(err).__name__})"
    if isinstance(err, exc.SQLAlchemyError | sqlite3.Error):
        return f"database error ({type(err).__name__})"
    return None
