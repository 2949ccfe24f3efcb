"""What a log may say of a database error: never what the database says
about the data it refused.

PostgreSQL's error carries the refused row (`DETAIL: Failing row contains
(...)`, `Key (v)=(...) already exists`) and psycopg's diagnostic fields
(detail, context, the query); SQLAlchemy's text adds the statement. A log
line about a database error uses `db_error_text`: the driver's primary
message, the SQLSTATE, and the constraint, table and column it names —
names, not values. Every log line also passes through
turnstile.runtime.log_masking, which removes such details from whatever
else writes them (turnstile.engine.masking.without_db_details).
"""

from __future__ import annotations

import logging
import sqlite3

from sqlalchemy import exc

from turnstile.engine.errors import DatabaseUnavailable
from turnstile.engine.masking import mask_text, without_db_details
from turnstile.stores.engines import Dialect

log = logging.getLogger(__name__)


def _database_error(err: BaseException) -> BaseException | None:
    """The driver's error `err` is or was raised from, if any."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        if isinstance(current, exc.DBAPIError) and current.orig is not None:
            return current.orig
        if isinstance(current, sqlite3.Error) or type(current).__module__.startswith("psycopg"):
            return current
        current = current.__cause__ or current.__context__
    return None


def db_error_text(err: BaseException) -> str:
    """A loggable description of `err` (any exception; a database error's
    details about the data left out)."""
    orig = _database_error(err)
    if orig is None:
        return mask_text(without_db_details(f"{type(err).__name__}: {err}"))
    diag = getattr(orig, "diag", None)
    if diag is not None:  # psycopg: the fields that name, not the ones that quote
        primary = getattr(diag, "message_primary", None) or type(orig).__name__
        named = [f"{label} {value}" for label, value in (
            ("sqlstate", getattr(diag, "sqlstate", None)),
            ("constraint", getattr(diag, "constraint_name", None)),
            ("table", getattr(diag, "table_name", None)),
            ("column", getattr(diag, "column_name", None))) if value]
        text = f"{type(orig).__name__}: {primary}" + (f" ({', '.join(named)})" if named else "")
    else:  # sqlite3 names the constraint and column, never the value
        text = f"{type(orig).__name__}: {str(orig).splitlines()[0] if str(orig) else ''}"
    return mask_text(without_db_details(text))


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
