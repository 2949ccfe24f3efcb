"""Statements built once, run by SQLite's driver directly.

A turn's bookkeeping runs ~60 statements, nearly all of them statements
the stores build once (module constants, `functools.cache`d shapes, the
`insert_new` of each table) with every value bound at execution. On SQLite
the statement itself takes a few microseconds in the library; SQLAlchemy's
execution path around it (execution context, parameter processing, result
metadata, row mappings) took ~20 µs more each time, in a timed loop
(`python -m bench.micro db-reads db-reads-sa`: a memory write's claim), and
several times that in a busy worker.

`prebuilt(stmt)` marks such a statement. `Connection` (turnstile.stores
.connection) then runs it, on SQLite, through `driver_form`: compiled once
by SQLAlchemy for the connection's dialect (per set of inserted columns for
an INSERT without values), its parameters put in order, executed on the
transaction's own sqlite3 connection, rows read from the cursor. Nothing
else changes: the same SQL, the same transaction, the same errors (the
driver's wrapped as SQLAlchemy's `DBAPIError` family, as the stores and
turnstile.stores.db_errors expect).

Only statements that need nothing of SQLAlchemy at execution qualify,
checked when compiled: no parameter or result processing (the SQLite
tables' columns are INTEGER and TEXT), no expanding `IN` parameters. One
that needs more runs through SQLAlchemy as before; so does every statement
on PostgreSQL, where the round trip costs more than the path.
tests/test_prebuilt.py runs every marked statement both ways and compares.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Dialect as SADialect

S = TypeVar("S", bound=sa.Executable)

# id -> the statement (kept: its id is never reused while marked).
_MARKED: dict[int, sa.Executable] = {}


def prebuilt(stmt: S) -> S:
    """Mark `stmt`, built once with every value bound at execution (see the
    module's doc); returns it."""
    _MARKED[id(stmt)] = stmt
    return stmt


def marked() -> list[sa.Executable]:
    """Every statement marked so far (tests)."""
    return list(_MARKED.values())


@dataclass(frozen=True)
class DriverForm:
    """A marked statement as the driver runs it."""
    sql: str
    names: tuple[str, ...]  # the positional parameters' names, in order
    fixed: Mapping[str, Any]  # values compiled into binds (literals, defaults)
    required: frozenset[str]  # names the caller must give

    def args(self, params: Mapping[str, Any] | None) -> tuple[Any, ...]:
        given = params or {}
        missing = self.required.difference(given)
        if missing:
            raise exc.ArgumentError(
                f"no value for bind parameter(s) {', '.join(sorted(missing))}")
        return tuple(given[n] if n in given else self.fixed[n] for n in self.names)

    def run(self, raw: sqlite3.Connection, dialect: SADialect,
            params: Mapping[str, Any] | None) -> sqlite3.Cursor:
        args = self.args(params)
        try:
            return raw.execute(self.sql, args)
        except sqlite3.Error as err:
            raise exc.DBAPIError.instance(self.sql, args, err, sqlite3.Error,
                                          hide_parameters=True, dialect=dialect) from err


# (statement id, inserted columns) -> its form, or None: not for the driver.
_FORMS: dict[tuple[int, tuple[str, ...]], DriverForm | None] = {}


def driver_form(stmt: sa.Executable, dialect: SADialect,
                params: Mapping[str, Any] | None) -> DriverForm | None:
    """`stmt`'s driver form on SQLite, or None (not marked, or it needs
    SQLAlchemy at execution)."""
    if id(stmt) not in _MARKED:
        return None
    keys: tuple[str, ...] = ()
    if isinstance(stmt, sa.Insert):  # its columns are the values given
        keys = tuple(sorted(params or ()))
    key = (id(stmt), keys)
    try:
        return _FORMS[key]
    except KeyError:
        pass
    form = _compile(stmt, dialect, keys)
    _FORMS[key] = form  # a race compiles the same form twice
    return form


def _compile(stmt: Any, dialect: SADialect, keys: Sequence[str]) -> DriverForm | None:
    compiled = stmt.compile(dialect=dialect, column_keys=list(keys) if keys else None)
    if compiled.positiontup is None or dialect.paramstyle != "qmark":
        return None
    binds = compiled.binds
    if any(b.expanding or b.literal_execute for b in binds.values()):
        return None
    if compiled._bind_processors or any(  # SQLAlchemy's, read only
            col[3]._cached_result_processor(dialect, None) is not None
            for col in compiled._result_columns):
        return None
    fixed = compiled.construct_params(_check=False) or {}
    required = frozenset(name for name, b in binds.items() if b.required)
    # An INSERT's columns are parameters named by column.
    required |= frozenset(keys)
    return DriverForm(sql=compiled.string, names=tuple(compiled.positiontup),
                      fixed=dict(fixed), required=required)

