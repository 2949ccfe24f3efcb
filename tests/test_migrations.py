"""Alembic migrations: revision 0001 is exactly v0.1.0's schema, and a
database made by v0.1 (its DDL, kept in tests/data from the v0.1.0 tag, and
rows in it) upgrades to the newest schema and runs a turn with nothing lost
— on SQLite and PostgreSQL; the declared tables match the migrated schema;
the operator's commands, concurrent upgrades and the packaging. That each
later revision only adds: tests/test_revisions_only_add.py."""

from __future__ import annotations

import importlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from temporalio.client import Client

from tests.support.databases import sqlite_file_url
from tests.support.processes import free_port
from tests.support.schemas import schema_of
from tests.support.sql import fetchall, fetchone
from tests.support.turns import running_worker
from tests.test_sales_turns import DEMO, TODAY, approve_when_asked
from turnstile.engine.contract import TurnStatus
from turnstile.sales.app import build_sales_app
from turnstile.sales.planner import demo_planner
from turnstile.sales.seed import _rows, last_week
from turnstile.sales.service import build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer
from turnstile.stores.db import Database
from turnstile.stores.engines import engine_for
from turnstile.stores.memory import MemoryStore
from turnstile.stores.schema import (
    SchemaError,
    current,
    head_revision,
    upgrade,
    v0_1_tables,
)
from turnstile.stores.tables import metadata

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parent.parent


def v0_1_statements(dialect: str) -> list[str]:
    """v0.1.0's DDL, as its ensure_schema ran it (tests/data, dumped from the tag)."""
    text = (DATA / f"v0_1_0_schema.{dialect}.sql").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    return [s.strip() for s in body.split("\n;\n") if s.strip()]


def create_v0_1(db: Database) -> None:
    """Make the database exactly as v0.1 did, with its own drivers, no SQLAlchemy."""
    if db.dialect == "sqlite":
        raw = sqlite3.connect(db.path)
        for stmt in v0_1_statements("sqlite"):
            raw.execute(stmt)
        raw.commit()
        raw.close()
    else:
        with psycopg.connect(db.url, autocommit=True) as conn:
            for stmt in v0_1_statements("postgresql"):
                conn.execute(stmt)


def test_revision_0001_is_exactly_v0_1(fresh_url: str, tmp_path: Path,
                                       postgres_database_factory: Any) -> None:
    db = Database(fresh_url)
    upgrade(db, "0001")
    assert current(db) == "0001"
    made = schema_of(db)
    if db.dialect == "sqlite":
        v01 = Database(sqlite_file_url(tmp_path / "by-v01.db"))
        create_v0_1(v01)
        assert schema_of(v01) == made
        return
    with postgres_database_factory() as other:
        v01 = Database(other)
        create_v0_1(v01)
        assert schema_of(v01) == made


def _fill_v0_1(db: Database) -> None:
    """Rows a v0.1 install holds: a conversation, audit, e-mail tasks, sales.
    Written through the driver alone, as v0.1 wrote them."""
    messages = [
        ("c-old", 0, "system", "You are the sales assistant.", None, None, False, None),
        ("c-old", 1, "user", "How did last month go?", None, None, False, None),
        ("c-old", 2, "assistant", None, json.dumps([{"id": "q0", "name": "querySalesData",
                                                     "arguments": "{}"}]), None, False, None),
        ("c-old", 3, "tool", '{"totalCount": 3}', None, "q0", False,
         json.dumps({"turnstile.tool_name": "querySalesData"})),
        ("c-old", 4, "assistant", "Three customers did well.", None, None, False, None),
    ]
    statements: list[tuple[str, list[tuple[Any, ...]]]] = [
        ("INSERT INTO conversation VALUES (?, ?, ?)",
         [("c-old", "alice", "2026-10-01T00:00:00.000+00:00")]),
        ("INSERT INTO chat_message (conversation_id, seq, role, content, tool_calls,"
         " tool_call_id, is_error, attributes, created_at, workflow_id)"
         " VALUES (?, ?, ?, ?, ?, ?, ?, ?, '2026-10-01', 'wf-old')", messages),
        ("INSERT INTO tool_execution_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
         [("wf-old/q0", "wf-old", "c-old", "alice", "querySalesData", "{}",
           "2026-10-01T00:00:01", "2026-10-01T00:00:02", "COMPLETED", None)]),
        ("INSERT INTO email_task (task_id, idempotency_key, recipient, subject, body, status,"
         " attempts, created_at, updated_at, message_id, sent_at) VALUES"
         " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
         [("mail-old", "wf-old/e0", "ops@example.com", "Old", "body", "SENT", 1,
           "2026-10-01T00:00:03.000000Z", "2026-10-01T00:00:04.000000Z",
           "<mail-old@turnstile.local>", "2026-10-01T00:00:04.000000Z")]),
        ("INSERT INTO sales_record VALUES (?, ?, ?, ?, ?, ?)", list(_rows(3000, TODAY))),
    ]
    if db.dialect == "sqlite":
        raw = sqlite3.connect(db.path)
        for sql, rows in statements:
            raw.executemany(sql, rows)
        raw.commit()
        raw.close()
        return
    with psycopg.connect(db.url) as conn, conn.cursor() as cur:
        for sql, rows in statements:
            cur.executemany(sql.replace("?", "%s"), rows)


def _rows_of(db: Database, table: str, order: str) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, f"SELECT * FROM {table} ORDER BY {order}")


KEPT = {"conversation": "conversation_id", "chat_message": "conversation_id, seq",
        "tool_execution_log": "execution_id", "email_task": "task_id", "sales_record": "id"}


async def test_v0_1_database_upgrades_and_runs_a_turn(fresh_url: str, client: Client,
                                                      task_queue: str, tmp_path: Path) -> None:
    db = Database(fresh_url)
    create_v0_1(db)
    _fill_v0_1(db)
    before = {t: _rows_of(db, t, o) for t, o in KEPT.items()}
    assert current(db) is None  # v0.1 had no alembic_version

    assert upgrade(db) == head_revision()
    assert current(db) == head_revision()
    upgraded = {t: _rows_of(db, t, o) for t, o in KEPT.items()}
    # Columns added since v0.1 (execution_chain, 0005) are empty on old rows;
    # every column the old rows had is unchanged.
    assert {t: [{k: r[k] for k in before[t][0]} for r in rows]
            for t, rows in upgraded.items()} == before
    assert {r.get("execution_chain") for t in ("chat_message", "tool_execution_log")
            for r in upgraded[t]} == {None}
    assert {r.get("run_id") for r in upgraded["chat_message"]} == {None}  # 0006
    with db.connect() as conn:  # the new per-day rollup was filled from the old rows
        rolled = fetchone(conn, "SELECT SUM(order_count) AS n, SUM(total_cents) AS c"
                                " FROM sales_daily_total")
        raw = fetchone(conn, "SELECT COUNT(*) AS n, SUM(amount_cents) AS c FROM sales_record")
    assert rolled == raw and raw is not None and raw["n"] == 3000

    port = free_port()
    env = {"SMTP_PORT": str(port), "SMTP_HOST": "127.0.0.1"}
    with LocalSmtpServer(tmp_path / "mail", port=port):
        async with running_worker(client, task_queue, fresh_url, [build_sales_service()],
                                  provider=demo_planner(today=lambda: TODAY), env=env) as turns:
            handle = await turns.start(DEMO, service="sales-assistant", conversation="c-old")
            await approve_when_asked(handle, "ops-lead")
            result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    query = result.tool_calls[0]
    assert query.name == "querySalesData" and query.arguments["startDate"] == str(
        last_week(TODAY)[0])
    after = {t: _rows_of(db, t, o) for t, o in KEPT.items()}
    for table, rows in before.items():  # every old row is still there, unchanged
        kept = [{k: r[k] for k in rows[0]} for r in after[table]]
        assert all(r in kept for r in rows), table
    # The model read the old conversation before the new turn's messages.
    told = [m.content for m in MemoryStore(db).messages("c-old") if m.role != "system"]
    old = [r["content"] for r in before["chat_message"] if r["role"] != "system"]
    assert told[:len(old)] == old and len(told) > len(old)
    # The new turn's rows name the run that wrote them; the old rows none.
    runs = {r["seq"]: r["run_id"] for r in after["chat_message"]}
    assert {runs[r["seq"]] for r in before["chat_message"]} == {None}
    assert set(runs.values()) == {None, handle.result_run_id}


def test_partial_schema_is_refused_not_guessed(tmp_path: Path) -> None:
    db = Database(sqlite_file_url(tmp_path / "odd.db"))
    raw = sqlite3.connect(db.path)
    raw.execute("CREATE TABLE chat_message (conversation_id TEXT, seq BIGINT)")
    raw.commit()
    raw.close()
    with pytest.raises(SchemaError, match="not made by Turnstile v0.1"):
        upgrade(db)
    assert current(db) is None
    assert "chat_message" in v0_1_tables()


def test_operator_commands(tmp_path: Path) -> None:
    url = sqlite_file_url(tmp_path / "ops.db")
    create_v0_1(Database(url))
    env = {"DATABASE_URL": url, "PATH": "/usr/bin:/bin"}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "turnstile.db", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        return done.stdout

    head = head_revision()
    assert run("current") == f"database (sqlite) at no revision; newest {head}\n"
    assert run("upgrade") == f"database (sqlite) upgraded: no revision -> {head}\n"
    assert run("current") == f"database (sqlite) at {head}; newest {head}\n"


def test_migrations_ship_in_the_package() -> None:
    """A non-editable install carries every package (migrations included):
    the packages setuptools finds by pyproject's rule are every package on
    disk under turnstile/, and nothing else (tests/test_package_install.py
    builds the wheel itself)."""
    import tomllib

    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set(find_packages(str(ROOT), include=config["packages"]["find"]["include"]))
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "turnstile").rglob("__init__.py")}
    assert on_disk <= found, on_disk - found
    assert {p.split(".")[0] for p in found} == {"turnstile"}
    assert {"turnstile.migrations", "turnstile.migrations.versions"} <= found
    assert "script.py.mako" in config["package-data"]["turnstile.migrations"]


def test_declared_tables_match_the_migrated_schema(fresh_url: str) -> None:
    """The `sa.Table` declarations (stores + sales app) and the migrations
    agree: Alembic's autogenerate finds nothing to change, but the parts each
    engine does its own way and the declarations leave out."""
    # Every owner of stores tables, so all of them are declared on `metadata`;
    # the app's tables are on its own MetaData, handed over in its App.
    for owner in ("turnstile.stores.audit", "turnstile.stores.lock",
                  "turnstile.stores.ledger", "turnstile.stores.memory",
                  "turnstile.stores.message_parts", "turnstile.stores.payload_store",
                  "turnstile.stores.retrieval_index", "turnstile.stores.runs",
                  "turnstile.stores.streaming", "turnstile.stores.usage",
                  "turnstile.stores.grant_store"):
        importlib.import_module(owner)
    app_metadata = {table.metadata for table in build_sales_app().tables}
    # Alembic compares a sequence of MetaData too (its type hint names one).
    declared: Any = [metadata, *app_metadata]
    db = Database(fresh_url)
    upgrade(db)
    with engine_for(db.url).connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                 declared)

    def expected(diff: Any) -> bool:
        if isinstance(diff, list):  # column changes come in lists
            return all(expected(d) for d in diff)
        kind = diff[0]
        if kind == "remove_table":  # SQLite: the FTS5 table and its shadow tables
            return bool(db.dialect == "sqlite" and diff[1].name.startswith("retrieval_fts"))
        if kind in ("remove_column", "remove_index"):  # PostgreSQL: the tsvector + GIN index
            name = diff[3].name if kind == "remove_column" else diff[1].name
            return db.dialect == "postgresql" and name in ("tsv", "retrieval_document_tsv")
        if kind == "modify_nullable":  # v0.1's `TEXT PRIMARY KEY`: NULL allowed on SQLite
            return db.dialect == "sqlite" and diff[5] is True and diff[6] is False
        return False

    assert [d for d in diffs if not expected(d)] == []


def test_concurrent_upgrades_by_several_processes(fresh_url: str) -> None:
    """Workers starting together: one migrates, the others wait and find
    nothing to do (PostgreSQL advisory lock / SQLite immediate transaction)."""
    env = {"DATABASE_URL": fresh_url, "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-m", "turnstile.db", "upgrade"], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outputs]
    head = head_revision()
    assert sorted(out.rsplit("-> ", 1)[1].strip() for out, _ in outputs) == [head] * 3
    db = Database(fresh_url)
    with db.connect() as conn:
        assert fetchall(conn, "SELECT version_num FROM alembic_version") == [
            {"version_num": head}]
