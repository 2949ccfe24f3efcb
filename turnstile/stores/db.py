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
- `await db.call(fn, ...)`: the way activities run their own database work
  (memory, lock, journal, ledger, audit) from the event loop. On SQLite it
  runs at once, on the loop's thread; on PostgreSQL in a worker thread.
  SQLite is a library in this process: a bookkeeping statement takes
  microseconds, and handing it to a thread cost more than the work — each
  hop woke a pool thread, and each of its statements passed the GIL back and
  forth with the loop (~650 context switches per sales turn; 10 ms of the
  worker's ~60 ms of CPU per turn, bench/README.md). Run on the loop, one
  worker process's writes never wait for each other; another process
  holding SQLite's write lock (a second worker process, the e-mail sender's
  thread) is waited for on the loop, for as long as its transaction lasts
  (the busy timeout bounds it). While a journaled tool's transaction is
  open in this process — it holds the write lock while the tool runs, and
  its commit waits for the loop — `call` hops to a thread, as before, so
  the loop never waits for a lock only the loop could release.
  TURNSTILE_SQLITE_ON_LOOP=off: threads always, as on PostgreSQL. Tools and
  event listeners (user code) keep their threads. Work run on the loop keeps
  one connection of its own between transactions (`connect` takes it
  instead of a pooled one: a pool checkout and its return cost ~1 ms of a
  turn's CPU, for ~18 transactions), dropped after a database error.
- A connection that cannot be opened is a `DatabaseUnavailable` whose message
  is a short category; the driver's text (host, role, SQL) goes to the log only.
- Statements are Core expressions on those tables; rows come back as the
  caller's own types (`Connection.rows(stmt, SomeRow)`: a NamedTuple or
  dataclass whose fields are the selected columns' labels); there is no
  dict-row read (tests that check tables with raw SQL use tests/support/sql.py).
  The statements every turn runs are built once and marked `prebuilt`: on
  SQLite the driver runs them directly (turnstile.stores.prebuilt).

Where it is: `Database` here; the engines and URL forms in
turnstile.stores.engines; `Connection` in turnstile.stores.connection;
`Transaction` in turnstile.stores.transaction; the tables' `metadata` and
shared column forms in turnstile.stores.tables; the errors in
turnstile.stores.db_errors.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar
from urllib.parse import urlparse

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Engine

from turnstile.stores.connection import Connection
from turnstile.stores.db_errors import unavailable
from turnstile.stores.engines import Dialect, engine_for, sqlalchemy_url

P = ParamSpec("P")
T = TypeVar("T")


class Database:
    """The database of one DATABASE_URL (and its read-only connection)."""

    def __init__(self, url: str, *, readonly_url: str | None = None,
                 on_loop: bool = True) -> None:
        target = sqlalchemy_url(url)  # refuses unknown schemes early
        self.url = url
        self.dialect: Dialect = "sqlite" if target.startswith("sqlite") else "postgresql"
        if self.dialect == "sqlite":
            # sqlite:///ABSOLUTE/PATH -> path "/ABSOLUTE/PATH"
            self.path = Path(urlparse(url).path)
        self.readonly_url = readonly_url
        self.on_loop = on_loop and self.dialect == "sqlite"  # call(): no thread hop
        # Transactions open outside a with-block (turnstile.stores.transaction:
        # a journaled tool's, whose commit waits for the loop): while one is,
        # call() hops to a thread, so the loop never waits for a lock that
        # only the loop can release. The gate makes the check and the opening
        # exclusive.
        self._gate = threading.RLock()  # re-entrant: work run on the loop may open one
        self._open_transactions = 0
        # The thread running work inline in `call` (the loop's), while it
        # does, and the connection that work keeps between transactions.
        self._inline_thread: int | None = None
        self._kept: tuple[Engine, sa.Connection] | None = None
        self._kept_busy = False

    def __repr__(self) -> str:
        return f"Database({self.dialect})"

    @property
    def engine(self) -> Engine:
        return engine_for(self.url)

    def reader_engine(self) -> Engine:
        return engine_for(self.url, readonly=True, readonly_url=self.readonly_url)

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)`, a blocking function of this database's
        stores, from async code: on SQLite at once, on PostgreSQL in a
        worker thread (`asyncio.to_thread`); with `on_loop=False`
        (TURNSTILE_SQLITE_ON_LOOP=off) in a thread on SQLite too. See the
        module's docstring."""
        if self.on_loop and self._gate.acquire(blocking=False):
            try:
                if self._open_transactions == 0:
                    self._inline_thread = threading.get_ident()
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        self._inline_thread = None
            finally:
                self._gate.release()
        return await asyncio.to_thread(fn, *args, **kwargs)

    def transaction_opening(self) -> None:
        """A `Transaction` is opening (before its BEGIN): call() hops to a
        thread until it has closed. Waits while work runs on the loop."""
        with self._gate:
            self._open_transactions += 1

    def transaction_closed(self) -> None:
        with self._gate:
            self._open_transactions -= 1

    @contextmanager
    def connect(self, *, readonly: bool = False) -> Iterator[Connection]:
        """A pooled connection in one transaction: committed on success,
        rolled back on error. Work that `call` runs on the loop takes the
        connection it keeps instead (one transaction at a time; a nested
        one takes a pooled connection); a database error drops it, so the
        next transaction starts on a fresh one, through the pool's checks."""
        keep = (not readonly and not self._kept_busy
                and self._inline_thread == threading.get_ident())
        if keep:
            self._kept_busy = True
        try:
            sa_conn = self._checkout(readonly, keep)
            try:
                with sa_conn.begin():
                    yield Connection(sa_conn, self.dialect)
            except exc.SQLAlchemyError as err:
                if keep:
                    self.release_kept()
                if isinstance(err, exc.DBAPIError) and err.connection_invalidated:
                    raise unavailable(err, self.dialect, readonly) from err
                raise
            finally:
                if not keep:
                    sa_conn.close()
        finally:
            if keep:
                self._kept_busy = False

    def _checkout(self, readonly: bool, keep: bool) -> sa.Connection:
        """A connection from the pool, or (`keep`) the one kept for the loop."""
        engine = self.reader_engine() if readonly else self.engine
        if keep and self._kept is not None:
            if self._kept[0] is engine:
                return self._kept[1]
            self.release_kept()  # the engines were disposed (tests, shutdown)
        try:
            sa_conn = engine.connect()
        except (exc.OperationalError, exc.InterfaceError) as err:
            raise unavailable(err, self.dialect, readonly) from err
        if keep:
            self._kept = (engine, sa_conn)
        return sa_conn

    def release_kept(self) -> None:
        """Give the kept connection back to the pool (tests, shutdown)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            kept[1].close()

    @contextmanager
    def joined(self, conn: Connection | None) -> Iterator[Connection]:
        """`conn` when the caller holds a transaction (writes join it), else a
        new connection in its own transaction."""
        if conn is not None:
            yield conn
            return
        with self.connect() as own:
            yield own
