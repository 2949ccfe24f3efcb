"""The database schema is made and changed only by the Alembic migrations in
`turnstile/migrations` (shipped inside the package).

`upgrade(db, tables=...)` brings a database to the newest revision and
(PostgreSQL) re-applies the privileges the apps' tables name (`tables`, from
turnstile.runtime.apps.App); the worker and `starter.py seed` call it on
start, operators run `python -m turnstile.db upgrade`. Several processes may
call it at once: on PostgreSQL an advisory lock, on SQLite an immediate write
transaction, lets one of them migrate while the others wait and then find
nothing to do.

A database made by v0.1 (its tables, no `alembic_version`) is recognised and
stamped at revision 0001 (exactly v0.1's schema) before the later revisions
run; a database holding only some of v0.1's tables is refused, not guessed at.

A database at a revision this code does not know (a newer release migrated
it) is left as it is when every newer revision is marked compatible with
older code — the code runs on it, logging that it "runs on a newer schema" —
and refused with `NewerSchema` otherwise (turnstile.stores.schema_window,
which also records each revision's mark in the database as it migrates).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from importlib import resources
from urllib.parse import unquote, urlparse

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from turnstile.engine.errors import ConfigurationError
from turnstile.stores.db import Database
from turnstile.stores.engines import READER_ROLE, engine_for
from turnstile.stores.schema_window import check_window, known_revisions, record
from turnstile.stores.tables import metadata

log = logging.getLogger(__name__)

V0_1_REVISION = "0001"
_ADVISORY_LOCK = 7262010  # the key v0.1 used for its schema lock
_lock = threading.Lock()
pg_roles = sa.table("pg_roles", sa.column("rolname", sa.Text))  # PostgreSQL's catalogue


class SchemaError(ConfigurationError):
    """The database's schema is not one the migrations can take forward."""

    error_type = "SchemaError"


def alembic_config() -> Config:
    config = Config()
    location = resources.files("turnstile") / "migrations"
    config.set_main_option("script_location", str(location))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _migration_engine(db: Database) -> sa.Engine:
    if db.dialect == "postgresql":
        return engine_for(db.url)
    # SQLite: the driver's own transaction handling would commit each DDL
    # statement on its own; take the write lock up front and make the whole
    # upgrade one transaction.
    engine = sa.create_engine(f"sqlite:///{db.path}", poolclass=sa.NullPool,
                              connect_args={"isolation_level": None, "timeout": 60})

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def current(db: Database) -> str | None:
    """The revision the database is at (None: no migrations ran)."""
    with engine_for(db.url).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


# The apps whose tables the revisions themselves make: the reference app's
# tables were part of the one schema before apps were chosen (TURNSTILE_APPS),
# so revisions 0001-0004 make them — when that app is served.
REVISION_APPS = frozenset({"sales"})


def upgrade(db: Database, revision: str = "head", *, tables: Iterable[sa.Table] = (),
            apps: Mapping[str, Sequence[sa.Table]] | None = None) -> str | None:
    """Migrate `db` to `revision` (newest by default); returns the revision
    it is at afterwards. `apps`: the served apps' names and tables (None:
    every app the revisions know, as before apps were chosen). An app's
    tables the revisions do not make are created, as declared, when missing
    (in the same transaction). `tables` and the apps' tables: whose
    privileges (`info`) are granted afterwards."""
    tables = list(dict.fromkeys([*tables, *(t for ts in (apps or {}).values() for t in ts)]))
    if db.dialect == "sqlite":
        db.path.parent.mkdir(parents=True, exist_ok=True)
    engine = _migration_engine(db)
    with _lock, engine.connect() as conn:
        with conn.begin():
            if db.dialect == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_ADVISORY_LOCK)))
            _stamp_v0_1(conn)
            config = alembic_config()
            scripts = ScriptDirectory.from_config(config)
            if not _on_newer_schema(conn, scripts):
                config.attributes["connection"] = conn
                config.attributes["apps"] = None if apps is None else frozenset(apps)
                command.upgrade(config, revision)
                record(conn, scripts, MigrationContext.configure(conn).get_current_revision())
                if apps is not None and revision == "head":
                    _create_app_tables(conn, apps)
                if db.dialect == "postgresql":
                    granted = [*metadata.sorted_tables, *tables]
                    _grant_reader(conn, reader_role(db), granted)
                    _grant_tool_roles(conn, granted)
        now = MigrationContext.configure(conn).get_current_revision()
    if engine is not engine_for(db.url):
        engine.dispose()
    return now


def _on_newer_schema(conn: sa.Connection, scripts: ScriptDirectory) -> bool:
    """Is the database at a revision this code does not know, every newer one
    compatible (True: leave it as it is)? NewerSchema when one is not."""
    at = MigrationContext.configure(conn).get_current_revision()
    if at is None or at in known_revisions(scripts):
        return False
    newer = check_window(conn, scripts, at)
    log.warning("this code (newest revision %s) runs on a newer schema (%s): the revisions "
                "after it (%s) are marked compatible with older code; nothing migrated",
                scripts.get_current_head(), at, ", ".join(n.revision for n in reversed(newer)))
    return True


def _create_app_tables(conn: sa.Connection, apps: Mapping[str, Sequence[sa.Table]]) -> None:
    present = set(sa.inspect(conn).get_table_names())
    for name, app_tables in apps.items():
        missing = sorted(t.name for t in app_tables if t.name not in present)
        if not missing:
            continue
        if name in REVISION_APPS:
            raise SchemaError(
                f"the database was migrated without the {name!r} app (TURNSTILE_APPS): its "
                f"tables {missing} are made by the core revisions, which already ran. Serve "
                f"it on a fresh database (DATABASE_URL), or one migrated with it")
        for table in app_tables:
            if table.name in missing and table.name not in present:
                table.create(conn)
                present.add(table.name)  # a table two apps share is made once
                log.info("app %s: created table %s", name, table.name)


@cache
def v0_1_tables() -> frozenset[str]:
    """Every table v0.1.0's ensure_schema created: what revision 0001 makes."""
    v0_1 = ScriptDirectory.from_config(alembic_config()).get_revision(V0_1_REVISION)
    assert v0_1 is not None
    return frozenset(v0_1.module.V0_1_TABLES)


def _stamp_v0_1(conn: sa.Connection) -> None:
    tables = set(sa.inspect(conn).get_table_names())
    if "alembic_version" in tables:
        return
    expected = v0_1_tables()
    present = tables & expected
    if not present:
        return  # an empty database: revision 0001 creates everything
    missing = expected - present
    if missing:
        raise SchemaError(
            f"the database has some of Turnstile's tables but not {sorted(missing)} and no "
            "alembic_version: it was not made by Turnstile v0.1 and cannot be upgraded "
            "automatically"
        )
    log.warning("database made by Turnstile v0.1: stamping revision %s, then upgrading",
                V0_1_REVISION)
    MigrationContext.configure(conn).stamp(ScriptDirectory.from_config(alembic_config()),
                                           V0_1_REVISION)


def reader_role(db: Database) -> str:
    """The login of the read-only connection: DATABASE_READONLY_URL's user, or
    `turnstile_reader` (the role `reader_url` derives)."""
    if db.readonly_url:
        user = urlparse(db.readonly_url).username
        if user:
            return unquote(user)
    return READER_ROLE


def _role_exists(conn: sa.Connection, role: str) -> bool:
    return conn.execute(sa.select(pg_roles.c.rolname).where(pg_roles.c.rolname == role)) \
        .first() is not None


def _grant(conn: sa.Connection, role: str, grants: list[str]) -> None:
    """USAGE on the current schema, then `grants`, each on its own: one the
    migrating user may not give is logged and the others still apply.
    GRANT has no SQLAlchemy expression: the statements are text, with every
    name quoted by the dialect."""
    quote = conn.dialect.identifier_preparer.quote
    schema = quote(conn.execute(sa.select(sa.func.current_schema())).scalar_one())
    for stmt in [f"GRANT USAGE ON SCHEMA {schema} TO {quote(role)}", *grants]:
        try:
            with conn.begin_nested():
                conn.execute(sa.text(stmt))
        except sa.exc.ProgrammingError as err:  # insufficient_privilege
            log.warning("cannot %s: %s", stmt, err.orig)


def _grant_reader(conn: sa.Connection, role: str, tables: Iterable[sa.Table]) -> None:
    """SELECT for the read-only role on the `tables` marked `info={"reader": True}`
    (an app marks its own), and nothing else. Re-applied on
    every upgrade (GRANT is idempotent), so a role made after the tables, or a
    table added by a later revision, gets its privilege. A missing role or a
    user who may not grant is logged, not fatal: the query tool then reports
    the failure."""
    if not _role_exists(conn, role):
        log.warning("read-only role %r does not exist: the read-only connection cannot "
                    "connect until it does (see deploy/postgres/init-turnstile.sh)", role)
        return
    quote = conn.dialect.identifier_preparer.quote
    present = set(sa.inspect(conn).get_table_names())
    readable = [t.name for t in tables if t.info.get("reader") and t.name in present]
    _grant(conn, role, [f"GRANT SELECT ON {quote(t)} TO {quote(role)}" for t in readable])


def ensure_schema(db: Database, *, tables: Iterable[sa.Table] = ()) -> None:
    """Bring the database to the newest schema (kept for existing callers)."""
    upgrade(db, tables=tables)


def _grant_tool_roles(conn: sa.Connection, tables: Iterable[sa.Table]) -> None:
    """The privileges of the tool roles, from each of `tables`' `info["grants"]`
    ({role: "SELECT, INSERT"}), re-applied on every upgrade like the reader's.
    A role that does not exist (the migrating user may not create roles and
    the operator has not) is logged: its tools are then refused with
    ToolRoleUnavailable unless TURNSTILE_ALLOW_UNPRIVILEGED_TOOLS lets them run
    as the application (the app's tool roles: e.g. turnstile.sales.access)."""
    quote = conn.dialect.identifier_preparer.quote
    present = set(sa.inspect(conn).get_table_names())
    wanted: dict[str, list[str]] = {}
    for table in tables:
        if table.name not in present:
            continue
        for role, privileges in table.info.get("grants", {}).items():
            wanted.setdefault(role, []).append(
                f"GRANT {privileges} ON {quote(table.name)} TO {quote(role)}")
    for role, grants in wanted.items():
        if not _role_exists(conn, role):
            log.warning("tool role %r does not exist: its tools are refused until it does "
                        "(see deploy/postgres/init-turnstile.sh)", role)
            continue
        _grant(conn, role, grants)
