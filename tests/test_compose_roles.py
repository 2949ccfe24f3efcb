"""The docker-compose database roles, reproduced on the local PostgreSQL: the
real deploy/postgres/init-turnstile.sh makes an application role without
CREATEROLE and the reader role; the worker migrates as the application and
the demo turn's `querySalesData` runs as the reader (v0.1 failed here: the
reader role never existed in that stack)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest
from temporalio.client import Client

from tests.support.databases import ADMIN_URL, require_postgres
from tests.support.processes import free_port
from tests.support.turns import running_worker
from tests.test_compose import COMPOSE, environment_of
from tests.test_sales_turns import DEMO, TODAY, approve_when_asked
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.sales.planner import demo_planner
from turnstile.sales.schema import EMAIL_ROLE, FOLLOWUP_ROLE, SENDER_ROLE
from turnstile.sales.seed import BIG_CUSTOMERS, seed
from turnstile.sales.service import build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer
from turnstile.stores.db import Database
from turnstile.stores.engines import dispose_engines

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "deploy" / "postgres" / "init-turnstile.sh"
TOOL_ROLES = (FOLLOWUP_ROLE, EMAIL_ROLE, SENDER_ROLE)


@pytest.fixture
def compose_roles() -> Iterator[dict[str, str]]:
    """Run the init script as the image would, with unique names on the shared
    server; drop what it made afterwards."""
    require_postgres()
    if shutil.which("psql") is None:
        pytest.skip("psql (the init script's client) is not installed")
    admin = urlparse(ADMIN_URL)
    tag = uuid.uuid4().hex[:10]
    names = {"TURNSTILE_DB_USER": f"ts_app_{tag}", "TURNSTILE_DB_PASSWORD": "app-secret",
             "TURNSTILE_DB_NAME": f"ts_compose_{tag}", "TURNSTILE_READER_USER": f"ts_reader_{tag}",
             "TURNSTILE_READER_PASSWORD": "reader-secret"}
    env = {**os.environ, **names, "POSTGRES_USER": admin.username or "postgres",
           "PGHOST": admin.hostname or "127.0.0.1", "PGPORT": str(admin.port or 5432)}
    try:
        subprocess.run(["sh", str(INIT)], env=env, check=True, capture_output=True, timeout=60)
        yield names
    finally:
        dispose_engines()
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{names["TURNSTILE_DB_NAME"]}" WITH (FORCE)')
            for role in (names["TURNSTILE_DB_USER"], names["TURNSTILE_READER_USER"]):
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_compose_passes_the_reader_url_the_init_script_makes() -> None:
    import yaml

    compose = yaml.safe_load(COMPOSE.read_text())
    worker = environment_of(compose["services"]["worker"])
    reader = urlparse(worker["DATABASE_READONLY_URL"])
    app = urlparse(worker["DATABASE_URL"])
    assert reader.username == "turnstile_reader" and reader.path == app.path
    assert reader.hostname == app.hostname == "postgresql"
    script = INIT.read_text()
    assert ': "${TURNSTILE_READER_USER:=turnstile_reader}"' in script
    assert "NOCREATEROLE" in script


async def test_demo_turn_with_the_compose_roles(compose_roles: dict[str, str], client: Client,
                                                task_queue: str, tmp_path: Path) -> None:
    admin = urlparse(ADMIN_URL)
    server = f"{admin.hostname}:{admin.port or 5432}/{compose_roles['TURNSTILE_DB_NAME']}"
    app_url = (f"postgresql://{compose_roles['TURNSTILE_DB_USER']}:"
               f"{compose_roles['TURNSTILE_DB_PASSWORD']}@{server}")
    reader_url = (f"postgresql://{compose_roles['TURNSTILE_READER_USER']}:"
                  f"{compose_roles['TURNSTILE_READER_PASSWORD']}@{server}")
    with psycopg.connect(ADMIN_URL) as conn:
        flags = conn.execute("SELECT rolcreaterole, rolsuper FROM pg_roles WHERE rolname = %s",
                             (compose_roles["TURNSTILE_DB_USER"],)).fetchone()
        # The application cannot make roles...
        # ...but the init script granted it the tool roles, to SET ROLE to.
        member = conn.execute(
            "SELECT bool_and(pg_has_role(%s, r, 'MEMBER')) FROM unnest(%s::text[]) AS r",
            (compose_roles["TURNSTILE_DB_USER"], list(TOOL_ROLES))).fetchone()
    assert flags == (False, False)
    assert member == (True,)

    db = Database(app_url, readonly_url=reader_url)
    seed(db, rows=3000, today=TODAY)  # `starter.py seed`: migrates as the application
    port = free_port()
    env = {"SMTP_PORT": str(port), "SMTP_HOST": "127.0.0.1", "DATABASE_READONLY_URL": reader_url}
    with LocalSmtpServer(tmp_path / "mail", port=port):
        async with running_worker(client, task_queue, app_url, [build_sales_service()],
                                  provider=demo_planner(today=lambda: TODAY), env=env) as turns:
            handle = await turns.start(DEMO, service="sales-assistant", conversation="c-compose")
            await approve_when_asked(handle, "ops-lead")
            result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    query = result.tool_calls[0]
    assert (query.name, query.status) == ("querySalesData", CallStatus.COMPLETED)
    assert len(result.tool_calls[1].arguments["customerIds"]) == BIG_CUSTOMERS

    # The reader reads the sales tables and nothing else; it writes nothing.
    with psycopg.connect(reader_url, autocommit=True) as conn:
        # Row-level security: the rows of the last 90 days (all 3000 while
        # TODAY is recent; fewer as the calendar moves on, never older ones).
        start = (datetime.now(UTC).date() - timedelta(days=90)).isoformat()
        with psycopg.connect(app_url, autocommit=True) as app:
            recent = app.execute("SELECT COUNT(*) FROM sales_record WHERE create_time >= %s",
                                 (start,)).fetchone()
        assert conn.execute("SELECT COUNT(*) FROM sales_record").fetchone() == recent
        assert conn.execute("SELECT COALESCE(SUM(order_count), 0) FROM sales_daily_total"
                            ).fetchone() == recent
        for sql in ("SELECT * FROM email_task", "SELECT * FROM chat_message",
                    "DELETE FROM sales_record", "INSERT INTO sales_daily_total VALUES "
                    "('2026-01-01', 'x', 'x', 'x', 1, 1, 'x')", "CREATE TABLE evil (x int)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)  # type: ignore[call-overload]
