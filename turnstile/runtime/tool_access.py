"""How a tool (or an app's background process) reaches the database: its own
role, a statement timeout. The sales app's roles are the example below
(turnstile.sales.access names them); the public outbox (turnstile.outbox)
takes its roles the same way.

PostgreSQL: every tool has a role with exactly the rights its job needs
(migration 0004, granted after each upgrade from the tables'
`info["grants"]`; the sales app's four roles are listed in
turnstile.sales.access).

The reader is its own login (DATABASE_READONLY_URL) because it always was;
the other roles are NOLOGIN and reached with `SET LOCAL ROLE` from the
application's pooled connection, inside the tool's transaction (so it ends
with the transaction and a pooled connection never keeps it). Why not a login
and URL per tool: no password per tool to deploy and rotate, one pool instead
of four, and it works where the application may not create roles (compose):
the operator makes the roles once and grants them to the application
(deploy/postgres/init-turnstile.sh). The journal, memory and audit writes stay
on the application's own role. Least privilege fails closed: a role the
application cannot use (missing, or not granted to it) refuses the tool
(`ToolRoleUnavailable`, not retried: the call ends failed, audited, and the
model is told), and the sender's pass that needs it fails and is retried.
`TURNSTILE_ALLOW_UNPRIVILEGED_TOOLS=true` opts out: the tool then runs as the
application, logged at error level once.

SQLite has no roles: the query tool's connection is read-only (mode=ro, an
authorizer that refuses writes and ATTACH), the others are the application's.

A tool that writes does so on the call journal's connection
(`tool_transaction`, ToolContext.transaction): `SET LOCAL ROLE` and the
statement timeout inside a savepoint, reset at its end, so the journal's
ledger, audit and memory writes that follow in the same transaction run as
the application, and the effect commits with them or not at all.

Every tool statement runs under a statement timeout (ToolSpec's
`statement_timeout_seconds`, default 3 s): PostgreSQL's `statement_timeout`,
SQLite's progress handler. A timeout is a retryable ToolExecutionError: the
model sees "the query took too long" when the tool's retries are spent.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from turnstile.engine.specs import DEFAULT_STATEMENT_TIMEOUT_SECONDS
from turnstile.runtime.tools import ToolContext, ToolExecutionError
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database

log = logging.getLogger(__name__)

_usable: dict[tuple[str, str], bool] = {}
_usable_lock = threading.Lock()


class ToolRoleUnavailable(ToolExecutionError):
    """The database role a tool runs as is missing or not granted to the
    application: the tool is refused rather than run with the application's
    rights (TURNSTILE_ALLOW_UNPRIVILEGED_TOOLS=true opts out)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def unprivileged_allowed() -> bool:
    """The operator's explicit opt-out of least privilege (read per call)."""
    value = os.environ.get("TURNSTILE_ALLOW_UNPRIVILEGED_TOOLS", "")
    return value.strip().lower() in ("1", "true", "yes", "on")


class QueryTooLong(ToolExecutionError):
    """A tool's statement ran past its statement timeout and was stopped."""

    error_type = "QueryTooLong"


_pg_roles = sa.table("pg_roles", sa.column("rolname"), sa.column("oid"))


def _role_usable(conn: Connection, role: str) -> bool:
    key = (str(conn.sa.engine.url), role)
    with _usable_lock:
        known = _usable.get(key)
    if known is not None:
        return known
    roles = _pg_roles.c
    usable = bool(conn.execute(sa.select(sa.exists().where(
        roles.rolname == role,
        sa.func.pg_has_role(sa.func.current_user(), roles.oid, "MEMBER")))).scalar_one())
    if not usable and unprivileged_allowed():
        log.error("database role %r is missing or not granted to the application: the tools "
                  "that should run as it run as the application, as "
                  "TURNSTILE_ALLOW_UNPRIVILEGED_TOOLS allows (least privilege NOT in effect; "
                  "see deploy/postgres/init-turnstile.sh)", role)
    if usable:  # a refusal is asked again next time: the operator may grant it meanwhile
        with _usable_lock:
            _usable[key] = usable
    return usable


@contextmanager
def as_role(conn: Connection, role: str | None, *,
            reset: bool = True) -> Iterator[Connection]:
    """Run the statements of the block as `role` (PostgreSQL), then go back to
    the application's role within the same transaction (`reset=False` when the
    transaction ends with the block: the commit ends the SET LOCAL, one round
    trip fewer)."""
    if role is None or conn.dialect != "postgresql":
        yield conn
        return
    if not _role_usable(conn, role):
        if not unprivileged_allowed():
            raise ToolRoleUnavailable(
                f"refused: the database role {role!r} this work runs as is missing or not "
                "granted to the application (least privilege; an operator grants it, see "
                "deploy/postgres/init-turnstile.sh)")
        yield conn
        return
    quote = conn.sa.dialect.identifier_preparer.quote
    # Role switches are PostgreSQL statements SQLAlchemy has no construct for.
    conn.execute(f"SET LOCAL ROLE {quote(role)}")
    yield conn
    # Only after success: a failed statement aborted the transaction, whose
    # rollback ends the SET LOCAL anyway.
    if reset:
        conn.execute("RESET ROLE")


_TIMEOUT = "statement_timeout"


@contextmanager
def statement_timeout(conn: Connection, seconds: float, *,
                      restore: bool = False) -> Iterator[None]:
    """Bound the run time of each statement in the block; raise QueryTooLong.
    `restore`: give the transaction its timeout back after the block (the
    transaction goes on: the call journal's writes follow the tool's)."""
    if conn.dialect == "postgresql":
        from psycopg.errors import QueryCanceled

        before = conn.execute(sa.select(sa.func.current_setting(_TIMEOUT))).scalar_one() \
            if restore else None
        # SET takes no bind parameters (and has no Core construct); the value
        # is an int we computed.
        conn.execute(f"SET LOCAL statement_timeout = {max(1, int(seconds * 1000))}")
        try:
            yield
        except sa.exc.DBAPIError as exc:
            if isinstance(exc.orig, QueryCanceled):
                raise _timeout_error(seconds) from exc
            raise
        # Only after success: a failed statement's savepoint rollback undoes the SET.
        if before is not None:
            conn.execute(sa.select(sa.func.set_config(_TIMEOUT, before, sa.true())))
        return
    deadline = time.monotonic() + seconds
    # The handler runs every N SQLite VM instructions; non-zero aborts the query.
    raw = conn.raw
    raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        yield
    except sa.exc.OperationalError as exc:
        if isinstance(exc.orig, sqlite3.OperationalError) and "interrupted" in str(exc.orig):
            raise _timeout_error(seconds) from exc
        raise
    finally:
        raw.set_progress_handler(None, 0)


def _timeout_error(seconds: float) -> QueryTooLong:
    # Retryable: a slow plan under load may pass on the next attempt; the
    # tool's retry policy bounds how often.
    return QueryTooLong(
        f"the query took too long (over {seconds:g} s) and was stopped; try a shorter period "
        "or try again later")


@contextmanager
def tool_connection(
    db: Database,
    role: str | None,
    *,
    timeout_seconds: float = DEFAULT_STATEMENT_TIMEOUT_SECONDS,
    readonly: bool = False,
) -> Iterator[Connection]:
    """One transaction for a tool: as `role`, under the statement timeout."""
    with db.connect(readonly=readonly) as conn, statement_timeout(conn, timeout_seconds), \
            as_role(conn, role, reset=False):
        yield conn


@contextmanager
def tool_transaction(ctx: ToolContext, role: str | None) -> Iterator[Connection]:
    """A tool's writes on the call journal's connection (ToolContext.transaction):
    they commit with the record of how the call ended, or not at all. As
    `role`, under the tool's statement timeout; both end with the block, so the
    journal's writes that follow run as the application. Outside a turn the
    block is a transaction of its own."""
    with ctx.transaction() as conn, \
            statement_timeout(conn, ctx.statement_timeout_seconds, restore=True), \
            as_role(conn, role):
        yield conn
