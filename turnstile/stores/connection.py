"""`Connection`: one connection in one transaction, its statements and the
rows it reads as the caller's types."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult

from turnstile.stores.damage import is_decode_error, tolerant, undecodable_in
from turnstile.stores.engines import Dialect
from turnstile.stores.prebuilt import DriverForm, driver_form, prebuilt


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
        self._driver: Any = None  # the sqlite3 connection, once a prebuilt statement ran

    def _form(self, stmt: Any, params: Params | None) -> DriverForm | None:
        """A prebuilt statement's driver form on SQLite (turnstile.stores.prebuilt)."""
        if self.dialect != "sqlite":
            return None
        return driver_form(stmt, self.sa.dialect, params)

    def _run(self, form: DriverForm, params: Params | None) -> Any:
        if self._driver is None:
            self._driver = self.sa.connection.driver_connection
        return form.run(self._driver, self.sa.dialect, params)

    def _read(self, stmt: sa.Executable, params: Params | None,
              limit: int | None = None) -> tuple[Sequence[str], Sequence[Sequence[Any]]]:
        """The column names and the rows (at most `limit`) of a statement: a
        prebuilt one on SQLite by the driver, any other by SQLAlchemy. Text
        that is not UTF-8 (SQLite) is a damaged row, not an outage: the read
        is made again tolerantly to name the row (`DamagedRow`)."""
        try:
            return self._read_once(stmt, params, limit)
        except (exc.OperationalError, sqlite3.OperationalError) as err:
            if not (is_decode_error(err) and isinstance(stmt, sa.Select | sa.CompoundSelect)):
                raise
            with self.tolerant():
                names, rows = self._read_once(stmt, params, limit)
            damaged = undecodable_in(names, rows, _table_of(stmt))
            if damaged is None:
                raise
            raise damaged from None

    @contextmanager
    def tolerant(self) -> Iterator[None]:
        """Reads inside give text that is not UTF-8 as `Undecodable` values
        (turnstile.stores.damage) instead of failing: for whoever names
        damaged rows (`starter.py check`). PostgreSQL holds only UTF-8."""
        if self.dialect != "sqlite":
            yield
            return
        with tolerant(self.raw):
            yield

    def _read_once(self, stmt: sa.Executable, params: Params | None,
                   limit: int | None = None) -> tuple[Sequence[str], Sequence[Sequence[Any]]]:
        form = self._form(stmt, params)
        if form is not None:
            cur = self._run(form, params)
            try:
                names = [d[0] for d in cur.description or ()]
                return names, list(cur) if limit is None else cur.fetchmany(limit)
            finally:
                cur.close()
        result = self.sa.execute(stmt, params)
        try:
            return list(result.keys()), list(result) if limit is None else result.fetchmany(limit)
        finally:
            result.close()

    @property
    def raw(self) -> Any:
        """The driver's own connection (sqlite3 / psycopg), for driver-only
        features: SQLite's progress handler, PostgreSQL's COPY."""
        return self.sa.connection.driver_connection

    def execute(self, sql: Statement,
                params: Params | Sequence[Params] | None = None) -> CursorResult[Any]:
        """A statement with one set of parameters (a mapping), or once per
        mapping of a list (executemany), as SQLAlchemy's `execute` takes them;
        its result as SQLAlchemy returns it (`scalar()`, `mappings()`, ...)."""
        stmt = _text(sql) if isinstance(sql, str) else sql
        if params is None or isinstance(params, Mapping):
            return self.sa.execute(stmt, dict(params) if params else None)
        if isinstance(params, str | bytes):
            raise TypeError("execute takes parameters as a mapping or a list of mappings, "
                            f"not {type(params).__name__}")
        return self.sa.execute(stmt, [dict(r) for r in params])

    def executemany(self, sql: Statement, rows: Sequence[Params]) -> None:
        if rows:
            stmt = _text(sql) if isinstance(sql, str) else sql
            self.sa.execute(stmt, [dict(r) for r in rows])

    def rows(self, stmt: sa.Executable, into: Callable[..., T],
             params: Params | None = None) -> list[T]:
        """Every row, each as `into(**columns)` (a NamedTuple or dataclass
        whose fields are the selected columns' names). `params`: the values
        of a statement built once with `sa.bindparam`s."""
        names, found = self._read(stmt, params)
        rows = [into(**dict(zip(names, r, strict=True))) for r in found]
        rows_read.add(len(rows))
        return rows

    def row(self, stmt: sa.Executable, into: Callable[..., T],
            params: Params | None = None) -> T | None:
        """The first row as `into(**columns)`, or None; `params` as for `rows`."""
        names, found = self._read(stmt, params, limit=1)
        rows_read.add(len(found))
        return into(**dict(zip(names, found[0], strict=True))) if found else None

    def scalars(self, stmt: sa.Executable, into: Callable[[Any], T],
                params: Params | None = None) -> list[T]:
        """The first column of every row, each as `into(value)` (e.g. `int`);
        `params` as for `rows`."""
        values = [into(r[0]) for r in self._read(stmt, params)[1]]
        rows_read.add(len(values))
        return values

    def scalar(self, stmt: sa.Executable, into: Callable[[Any], T],
               params: Params | None = None) -> T | None:
        """The first column of the first row as `into(value)`; None when there
        is no row or the value is NULL. `params` as for `rows`."""
        found = self._read(stmt, params, limit=1)[1]
        rows_read.add(len(found))
        return None if not found or found[0][0] is None else into(found[0][0])

    def changed(self, stmt: sa.Executable, params: Params | None = None) -> int:
        """An UPDATE or DELETE (a statement built once, values bound at
        execution): the number of rows it changed."""
        form = self._form(stmt, params)
        if form is not None:
            cur = self._run(form, params)
            try:
                return int(cur.rowcount)
            finally:
                cur.close()
        return int(self.sa.execute(stmt, params).rowcount)

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
        return bool(self._read(_insert_new(self.dialect, table), dict(values), limit=1)[1])

    def upsert(self, table: sa.Table, values: Params) -> None:
        """INSERT, or on a primary key taken, UPDATE the row's other columns
        to `values`."""
        key = list(table.primary_key.columns)
        names = {col.name for col in key}
        stmt = self._insert(table, values)
        stmt = stmt.on_conflict_do_update(
            index_elements=key, set_={k: stmt.excluded[k] for k in values if k not in names})
        self.sa.execute(stmt)


def _table_of(stmt: sa.Select[Any] | sa.CompoundSelect[Any]) -> str:
    """The table a SELECT reads (the first one named), for an error's text."""
    select = stmt if isinstance(stmt, sa.Select) else stmt.selects[0]
    if not isinstance(select, sa.Select):
        return "a table"
    for from_ in select.get_final_froms():
        while isinstance(from_, sa.Subquery) and isinstance(from_.element, sa.Select):
            froms = from_.element.get_final_froms()
            if not froms:
                break
            from_ = froms[0]
        name = getattr(from_, "name", None)
        if isinstance(name, str):
            return name
    return "a table"


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
        _INSERTS_NEW[(dialect, table)] = prebuilt(stmt)  # a race builds the same twice
    return stmt

