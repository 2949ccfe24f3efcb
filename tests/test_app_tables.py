"""Which tables an app's database gets (turnstile.stores.schema.upgrade with
the served apps): a new app's tables are made as declared and no sales table
exists; the sales app's tables come from the revisions only when it is
served; serving it later on such a database is refused, clearly. SQLite and
PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import sqlalchemy as sa

from examples.support_desk import build_app
from turnstile.runtime.apps import tables_by_app
from turnstile.sales.app import build_sales_app
from turnstile.stores.db import Database
from turnstile.stores.engines import dispose_engines
from turnstile.stores.schema import SchemaError, head_revision, upgrade

SALES = {"sales_record", "sales_daily_total", "follow_up_task", "email_task", "approver"}
DESK = {"desk_order", "desk_refund"}


def tables(db: Database) -> set[str]:
    return set(sa.inspect(db.engine).get_table_names())


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    factory: Callable[[], AbstractContextManager[str]] = request.getfixturevalue(
        "postgres_database_factory")
    with factory() as url:
        yield url


def test_a_new_apps_database_has_its_tables_and_no_sales_table(fresh_url: str) -> None:
    db = Database(fresh_url)
    try:
        assert upgrade(db, apps=tables_by_app([build_app()])) == head_revision()
        made = tables(db)
        assert DESK <= made and not made & SALES
        assert {"chat_message", "tool_call_ledger", "tool_execution_log"} <= made
        # again: nothing to do, nothing made twice
        upgrade(db, apps=tables_by_app([build_app()]))
        # the sales app on this database: refused, saying why and what to do
        with pytest.raises(SchemaError) as err:
            upgrade(db, apps=tables_by_app([build_sales_app(), build_app()]))
        assert "migrated without the 'sales' app" in str(err.value)
        assert "fresh database" in str(err.value)
        assert not tables(db) & SALES
    finally:
        dispose_engines()


def test_both_apps_get_both_apps_tables(fresh_url: str) -> None:
    db = Database(fresh_url)
    try:
        upgrade(db, apps=tables_by_app([build_sales_app(), build_app()]))
        assert SALES | DESK <= tables(db)
    finally:
        dispose_engines()
