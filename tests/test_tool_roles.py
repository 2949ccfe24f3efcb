"""Least privilege per tool (migration 0004, turnstile.sales.access): each
PostgreSQL tool role is refused outside its rights, the query role sees the
last 90 days only, and the tools really run as their roles (taking a
privilege away from a role breaks its tool, though the application itself
still has it). On SQLite: the recipient rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psycopg
import pytest
import sqlalchemy as sa

from tests.support.sql import fetchone
from turnstile.engine.errors import ToolArgumentError
from turnstile.runtime.tools import Tool, ToolContext
from turnstile.sales.access import set_query_window
from turnstile.sales.sales_tools import createEmailTask, createFollowUpTask, querySalesData
from turnstile.sales.schema import EMAIL_ROLE, FOLLOWUP_ROLE, SENDER_ROLE, TABLES, utc_text
from turnstile.stores.db import Database
from turnstile.stores.engines import dispose_engines, reader_url
from turnstile.stores.schema import upgrade
from turnstile.stores.transaction import Transaction

pytest_plugins = ["tests.support.databases"]

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime.now(UTC)
RECENT = utc_text(NOW - timedelta(days=2))
OLD = utc_text(NOW - timedelta(days=120))
OTHER_TABLES = ("email_task", "follow_up_task", "tool_execution_log", "chat_message",
                "tool_call_ledger", "approval_decision", "conversation", "approver")
INSERT_EMAIL = ("INSERT INTO email_task (task_id, idempotency_key, recipient, subject, body,"
                " status, created_at, updated_at, message_id) VALUES"
                " (%s, %s, %s, 's', 'b', 'QUEUED', 't', 't', 'm')")
INSERT_FOLLOW_UP = ("INSERT INTO follow_up_task (customer_id, assignee, note, created_by_call,"
                    " created_at) VALUES ('C1', 'a', 'n', %s, 't')")


@pytest.fixture(scope="module")
def pg(postgres_database_factory: Any) -> Iterator[Database]:
    """A database of its own: the window and the revokes below stay in it."""
    with postgres_database_factory() as url:
        db = Database(url)
        upgrade(db, tables=TABLES)
        with db.connect() as conn:
            conn.executemany(
                "INSERT INTO sales_record VALUES (:id, :c, :c, 'x@example.com', 900000, :t)",
                [{"id": 1, "c": "C1", "t": RECENT}, {"id": 2, "c": "C2", "t": OLD}])
        yield db
        dispose_engines()


def as_role(db: Database, role: str) -> psycopg.Connection[Any]:
    """The application's login, switched to `role` as the tools do."""
    conn = psycopg.connect(db.url, autocommit=True)
    conn.execute(f"SET ROLE {role}")  # type: ignore[arg-type]
    return conn


def refused(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...] = ()) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql, params)  # type: ignore[arg-type]


def ctx(db: Database, call: str) -> ToolContext:
    return ToolContext(db=db, workflow_id="wf-roles", conversation_id="c", user_id="u",
                       tool_call_id=call)


async def invoke(t: Tool, db: Database, call: str, **arguments: Any) -> Any:
    return await t.invoke(ctx(db, call), t.parse_arguments(json.dumps(arguments)))


def test_query_role_reads_recent_sales_only_and_nothing_else(pg: Database) -> None:
    with psycopg.connect(reader_url(pg.url), autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("turnstile_reader",)
        assert conn.execute("SELECT id FROM sales_record").fetchall() == [(1,)]
        assert conn.execute("SELECT customer_id FROM sales_daily_total").fetchall() == [("C1",)]
        assert conn.execute("SELECT COUNT(*) FROM sales_record WHERE create_time < %s",
                            (RECENT,)).fetchone() == (0,)
        for table in OTHER_TABLES:
            refused(conn, f"SELECT * FROM {table}")
        refused(conn, "UPDATE sales_record SET amount_cents = 0")
        refused(conn, "DELETE FROM sales_daily_total")
        # It cannot widen its own window: the function is the owner's.
        refused(conn, "CREATE OR REPLACE FUNCTION turnstile_query_window_start() RETURNS text"
                      " LANGUAGE sql AS $$ SELECT ''::text $$")
        refused(conn, "ALTER TABLE sales_record DISABLE ROW LEVEL SECURITY")
    # The application (the tables' owner) sees everything.
    with pg.connect() as conn:
        assert fetchone(conn, "SELECT COUNT(*) AS n FROM sales_record") == {"n": 2}


def test_query_window_is_configurable(pg: Database) -> None:
    try:
        set_query_window(pg, 200)
        with psycopg.connect(reader_url(pg.url), autocommit=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM sales_record").fetchone() == (2,)
        set_query_window(pg, 1)
        with psycopg.connect(reader_url(pg.url), autocommit=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM sales_record").fetchone() == (0,)
    finally:
        set_query_window(pg, 90)


def test_query_window_command(pg: Database, tmp_path: Any) -> None:
    def run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "turnstile.db", "query-window", *args],
                              cwd=ROOT, env={**os.environ, "DATABASE_URL": url},
                              capture_output=True, text=True, timeout=60)

    try:
        done = run(pg.url, "off")
        assert done.returncode == 0 and "every sales row" in done.stdout, done.stderr
        with psycopg.connect(reader_url(pg.url), autocommit=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM sales_record").fetchone() == (2,)
        assert run(pg.url, "soon").returncode == 2
    finally:
        assert "the last 90 days" in run(pg.url, "90").stdout
    with psycopg.connect(reader_url(pg.url), autocommit=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM sales_record").fetchone() == (1,)
    sqlite = run(f"sqlite:///{tmp_path}/x.db", "30")
    assert sqlite.returncode == 2 and "PostgreSQL only" in sqlite.stderr


def test_follow_up_role_inserts_and_updates_follow_ups_only(pg: Database) -> None:
    with as_role(pg, FOLLOWUP_ROLE) as conn:
        conn.execute(INSERT_FOLLOW_UP, ("k-follow",))
        conn.execute("UPDATE follow_up_task SET status = 'CANCELLED' WHERE created_by_call = %s",
                     ("k-follow",))
        refused(conn, "DELETE FROM follow_up_task")
        refused(conn, "SELECT * FROM sales_record")
        refused(conn, INSERT_EMAIL, ("m-f", "k-f", "ops@example.com"))
        for table in ("email_task", "tool_execution_log", "chat_message"):
            refused(conn, f"SELECT * FROM {table}")


def test_email_role_may_only_insert_short_recipients(pg: Database) -> None:
    with as_role(pg, EMAIL_ROLE) as conn:
        conn.execute(INSERT_EMAIL, ("m-1", "k-1", "ops@example.com"))
        refused(conn, "SELECT * FROM email_task")
        refused(conn, "SELECT task_id FROM email_task WHERE idempotency_key = 'k-1'")
        refused(conn, "UPDATE email_task SET status = 'SENT'")
        refused(conn, "DELETE FROM email_task")
        for table in ("sales_record", "follow_up_task", "tool_execution_log"):
            refused(conn, f"SELECT * FROM {table}")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(INSERT_EMAIL, ("m-2", "k-2", "o" * 89 + "@example.com"))  # 101


def test_sender_role_reads_and_changes_email_tasks_only(pg: Database) -> None:
    with as_role(pg, SENDER_ROLE) as conn:
        conn.execute("SELECT task_id, status FROM email_task").fetchall()
        conn.execute("UPDATE email_task SET status = 'CANCELLED' WHERE task_id = 'none'")
        refused(conn, INSERT_EMAIL, ("m-s", "k-s", "ops@example.com"))
        refused(conn, "DELETE FROM email_task")
        for table in ("sales_record", "follow_up_task", "chat_message"):
            refused(conn, f"SELECT * FROM {table}")


async def test_tools_run_as_their_roles(pg: Database) -> None:
    """Revoke one right from a tool's role: its tool fails at the database
    (the application role, the tables' owner, would have succeeded)."""
    result = await invoke(querySalesData, pg, "q", startDate=OLD[:10], endDate=RECENT[:10],
                          minAmount=0)
    assert [r.customerId for r in result.salesRecords] == ["C1"]  # C2 is too old

    created = await invoke(createFollowUpTask, pg, "f1", customerIds=["C1"], assignee="a",
                           note="n")
    assert created.createdCount == 1
    # C2's sales are older than the reader's window: to the tool it is unknown.
    with pytest.raises(ToolArgumentError, match="unknown customerIds: C2"):
        await invoke(createFollowUpTask, pg, "f2", customerIds=["C2"], assignee="a", note="n")

    queued = await invoke(createEmailTask, pg, "e1", to="ops@example.com", subject="s",
                          body="b")
    again = await invoke(createEmailTask, pg, "e1", to="ops@example.com", subject="s", body="b")
    assert again.taskId == queued.taskId and "already queued" in again.note
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute(f"REVOKE INSERT ON email_task FROM {EMAIL_ROLE}")  # type: ignore[arg-type]
        admin.execute(f"REVOKE UPDATE ON follow_up_task FROM {FOLLOWUP_ROLE}"  # type: ignore[arg-type]
                      )
    try:
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            await invoke(createEmailTask, pg, "e2", to="ops@example.com", subject="s", body="b")
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            await createFollowUpTask.undo(ctx(pg, "f1"), FOLLOW_UP_ARGS, created.model_dump())
    finally:
        with psycopg.connect(pg.url, autocommit=True) as admin:
            admin.execute(f"GRANT INSERT ON email_task TO {EMAIL_ROLE}")  # type: ignore[arg-type]
            admin.execute(f"GRANT UPDATE ON follow_up_task TO {FOLLOWUP_ROLE}"  # type: ignore[arg-type]
                          )
    undone = await createFollowUpTask.undo(ctx(pg, "f1"), FOLLOW_UP_ARGS, created.model_dump())
    assert "cancelled 1" in str(undone)


async def test_tools_keep_their_roles_in_the_call_journal_transaction(pg: Database) -> None:
    """In a turn the tools write on the call journal's connection,
    still as their roles: a right taken from the role breaks the tool there
    too, and what the role may do still works."""
    def journaled(call: str) -> ToolContext:
        return ToolContext(db=pg, workflow_id="wf-roles-tx", conversation_id="c", user_id="u",
                           tool_call_id=call, journal_tx=Transaction(pg))

    ok = journaled("jf1")
    created = await createFollowUpTask.invoke(ok, FOLLOW_UP_ARGS)
    assert ok.journal_tx is not None
    ok.journal_tx.commit()
    assert created.createdCount == 1
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute(f"REVOKE INSERT ON follow_up_task FROM {FOLLOWUP_ROLE}"  # type: ignore[arg-type]
                      )
    refused_ctx = journaled("jf2")
    try:
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            await createFollowUpTask.invoke(refused_ctx, FOLLOW_UP_ARGS)
    finally:
        assert refused_ctx.journal_tx is not None
        refused_ctx.journal_tx.release()
        with psycopg.connect(pg.url, autocommit=True) as admin:
            admin.execute(f"GRANT INSERT ON follow_up_task TO {FOLLOWUP_ROLE}"  # type: ignore[arg-type]
                          )


FOLLOW_UP_ARGS = createFollowUpTask.parse_arguments(
    json.dumps({"customerIds": ["C1"], "assignee": "a", "note": "n"}))


def test_recipient_longer_than_100_is_refused_on_sqlite(db: Database) -> None:
    if db.dialect != "sqlite":
        pytest.skip("PostgreSQL's CHECK is tested with the e-mail role above")
    insert = ("INSERT INTO email_task (task_id, idempotency_key, recipient, subject, body,"
              " status, created_at, updated_at, message_id) VALUES"
              " (:id, :id, :to, 's', 'b', 'QUEUED', 't', 't', 'm')")
    with db.connect() as conn:
        conn.execute(insert, {"id": "ok", "to": "o" * 88 + "@example.com"})  # 100
    with pytest.raises(sa.exc.IntegrityError, match="email_task_recipient_length"), \
            db.connect() as conn:
        conn.execute(insert, {"id": "long", "to": "o" * 89 + "@example.com"})
    with pytest.raises(sa.exc.IntegrityError, match="email_task_recipient_length"), \
            db.connect() as conn:
        conn.execute("UPDATE email_task SET recipient = :to WHERE task_id = 'ok'",
                     {"to": "o" * 89 + "@example.com"})


def test_the_tool_refuses_a_recipient_the_database_would() -> None:
    """The model hears about the 100-character rule as an argument error it
    can correct, before the database's CHECK would refuse the row."""
    ok = createEmailTask.parse_arguments(json.dumps(
        {"to": "o" * 88 + "@example.com", "subject": "s", "body": "b"}))
    assert len(ok.to) == 100  # type: ignore[attr-defined]
    with pytest.raises(ToolArgumentError, match="at most 100 characters"):
        createEmailTask.parse_arguments(json.dumps(
            {"to": "o" * 89 + "@example.com", "subject": "s", "body": "b"}))


@pytest.fixture
def app_without_email_role(postgres_database_factory: Any) -> Iterator[Database]:
    """The application as docker-compose makes it (deploy/postgres/init-turnstile.sh;
    every PostgreSQL test's login is made so, tests/support/databases.py): a
    non-superuser login without CREATEROLE owning its database, granted the
    tool roles — all but turnstile_email, which the operator forgot."""
    from tests.support.databases import ADMIN_URL

    with postgres_database_factory() as url:
        app = urlparse(url).username
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'REVOKE {EMAIL_ROLE} FROM "{app}"')  # type: ignore[arg-type]
        db = Database(url)
        upgrade(db, tables=TABLES)  # as the application, as its worker does
        try:
            yield db
        finally:
            dispose_engines()


async def test_a_tool_whose_role_is_not_granted_is_refused(
        app_without_email_role: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """Least privilege fails closed: createEmailTask's role is not the
    application's, so the tool is refused (not retried), never run with the
    application's rights; the operator's explicit opt-out runs it as the
    application."""
    from turnstile.sales.access import ToolRoleUnavailable

    db = app_without_email_role
    with db.connect() as conn:
        assert fetchone(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") \
            == {"rolsuper": False}
    mail = {"to": "ops@example.com", "subject": "s", "body": "b"}
    with pytest.raises(ToolRoleUnavailable, match="turnstile_email") as refused_call:
        await invoke(createEmailTask, db, "e1", **mail)
    assert not refused_call.value.retryable
    with db.connect() as conn:
        assert fetchone(conn, "SELECT COUNT(*) AS n FROM email_task") == {"n": 0}
    monkeypatch.setenv("TURNSTILE_ALLOW_UNPRIVILEGED_TOOLS", "true")
    await invoke(createEmailTask, db, "e2", **mail)
    with db.connect() as conn:
        assert fetchone(conn, "SELECT COUNT(*) AS n FROM email_task") == {"n": 1}
