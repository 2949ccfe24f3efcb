"""Database fixtures: real SQLite files and a real PostgreSQL server.

PostgreSQL is the one at 127.0.0.1:5432 (administered as postgres, trust auth), or
TEST_POSTGRES_ADMIN_URL. When it does not answer: with CI=true (as .ci/run
sets it) the run stops at once with a clear error, since a suite that skips
half its tests must not pass; otherwise the tests that need it are skipped
and the run ends with one loud line saying how many.

- `sqlite_url`: a fresh SQLite file per test.
- Every test database is owned by a login of its own that is no superuser and
  may create neither roles nor databases, granted the tool roles: the
  application as production runs it.
- `postgres_url`: one fresh database `turnstile_t_<hex>` per test session,
  dropped (WITH FORCE) at the end. Creating a database costs ~0.1 s, so the
  `db` fixture reuses it and empties its tables between tests instead.
- `db`: parametrized over BACKENDS, a `Database` migrated to the newest schema
  (`migrate`: with the reference app's tables, as its worker migrates) and no
  rows in any table.
- `temporary_postgres_database()` (also as the `postgres_database_factory`
  fixture): a context manager for tests or module-scoped fixtures that want a
  database of their own.
- `fresh_url`: parametrized over BACKENDS, the URL of an empty database of
  its own (no schema; PostgreSQL: `temporary_postgres_database()`), for
  tests of the migrations.
- `worker_database_url(backend, request, tmp_path)`: the DATABASE_URL for a
  live test's worker on `backend` (a test parametrized over BACKENDS): a fresh
  SQLite file, or the session's PostgreSQL database, migrated and emptied.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest

from tests.support.sql import fetchall
from turnstile.sales.schema import TABLES as SALES_TABLES
from turnstile.stores.db import Database
from turnstile.stores.schema import ensure_schema

BACKENDS = ["sqlite", "postgresql"]
ADMIN_URL = os.environ.get("TEST_POSTGRES_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/test")

_reachable: bool | None = None


def postgres_reachable() -> bool:
    global _reachable
    if _reachable is None:
        try:
            psycopg.connect(ADMIN_URL, connect_timeout=3).close()
            _reachable = True
        except psycopg.OperationalError:
            _reachable = False
    return _reachable


def require_postgres() -> None:
    if not postgres_reachable():
        pytest.skip(f"PostgreSQL not reachable at {ADMIN_URL}")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def pytest_sessionstart(session: pytest.Session) -> None:
    if in_ci() and not postgres_reachable():
        raise pytest.UsageError(
            f"CI=true and PostgreSQL is not reachable at {ADMIN_URL}: the PostgreSQL half of "
            "the suite cannot run. Start PostgreSQL (trust auth, database `test`) or set "
            "TEST_POSTGRES_ADMIN_URL; unset CI to skip those tests locally.")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = sum(1 for report in terminalreporter.stats.get("skipped", [])
                  if "PostgreSQL not reachable" in str(getattr(report, "longrepr", "")))
    if skipped:
        terminalreporter.write_line(
            f"!!! {skipped} PostgreSQL test(s) SKIPPED: PostgreSQL not reachable at "
            f"{ADMIN_URL}. This run did not test PostgreSQL (CI=true makes it an error).",
            red=True, bold=True)


# Cluster-wide roles the application expects an operator to have made
# (deploy/postgres/init-turnstile.sh): the tool roles and the query tool's login.
OPERATOR_ROLES = ("turnstile_followup", "turnstile_email", "turnstile_sender")
READER_LOGIN = "turnstile_reader"


def _ensure_role(admin: psycopg.Connection, name: str, login: bool) -> None:
    exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
    if exists is None:
        try:
            admin.execute(f'CREATE ROLE "{name}" {"LOGIN" if login else "NOLOGIN"}')
        except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            pass  # made meanwhile by a parallel run


@contextmanager
def temporary_postgres_database() -> Iterator[str]:
    """Create `turnstile_t_<hex>` owned by a login of the same name that is
    no superuser and may create neither roles nor databases — the application
    as production runs it (deploy/postgres/init-turnstile.sh), with the tool
    roles granted —, yield its URL, drop both afterwards."""
    require_postgres()
    name = f"turnstile_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        for role in OPERATOR_ROLES:
            _ensure_role(admin, role, login=False)
        _ensure_role(admin, READER_LOGIN, login=True)
        admin.execute(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB')
        admin.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
        admin.execute(f'REVOKE ALL ON DATABASE "{name}" FROM PUBLIC')
        admin.execute(f'GRANT CONNECT ON DATABASE "{name}" TO "{READER_LOGIN}"')
        admin.execute(f'GRANT {", ".join(OPERATOR_ROLES)} TO "{name}"')
    try:
        admin_url = urlparse(ADMIN_URL)
        netloc = f"{name}@{admin_url.hostname or '127.0.0.1'}:{admin_url.port or 5432}"
        yield urlunparse(admin_url._replace(netloc=netloc, path=f"/{name}"))
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'DROP ROLE IF EXISTS "{name}"')


def migrate(db: Database) -> None:
    """The newest schema, and (PostgreSQL) the privileges the reference app's
    tables name: what its worker's upgrade does (worker.py)."""
    ensure_schema(db, tables=SALES_TABLES)


def sqlite_file_url(path: Path) -> str:
    return f"sqlite:///{path}"


def empty_all_tables(db: Database) -> None:
    """Delete every row of every table, whoever owns the table (but the
    migrations' own `alembic_version`)."""
    with db.connect() as conn:
        if db.dialect == "postgresql":
            names = [
                r["tablename"]
                for r in fetchall(conn,
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                    " AND tablename <> 'alembic_version'"
                )
            ]
            if names:
                quoted = ", ".join(f'"{n}"' for n in names)
                conn.execute(f"TRUNCATE {quoted} RESTART IDENTITY CASCADE")
        else:
            names = [
                r["name"]
                for r in fetchall(conn,
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                    " AND name NOT LIKE 'sqlite_%' AND name <> 'alembic_version'"
                )
            ]
            for n in names:
                conn.execute(f'DELETE FROM "{n}"')


def worker_database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The DATABASE_URL a live test's worker uses on `backend` ("sqlite" or
    "postgresql"): a fresh SQLite file, or the session's PostgreSQL database
    migrated and emptied of earlier tests' rows, so that checks over the
    whole database (the outbox the sender delivers, the truth check) see
    this test's rows alone, as on a fresh SQLite file."""
    if backend == "sqlite":
        return sqlite_file_url(tmp_path / "turnstile.db")
    url: str = request.getfixturevalue("postgres_url")
    database = Database(url)
    migrate(database)
    empty_all_tables(database)
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return sqlite_file_url(tmp_path / "turnstile.db")


@pytest.fixture(scope="session")
def postgres_database_factory() -> Callable[[], AbstractContextManager[str]]:
    return temporary_postgres_database


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with temporary_postgres_database() as url:
        yield url


@pytest.fixture(params=BACKENDS)
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield sqlite_file_url(tmp_path / "v01.db")
        return
    with temporary_postgres_database() as url:
        yield url


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
    else:
        url = sqlite_file_url(tmp_path / "turnstile.db")
    database = Database(url)
    migrate(database)
    if database.dialect == "postgresql":
        empty_all_tables(database)  # shared per session: start every test empty
    return database
