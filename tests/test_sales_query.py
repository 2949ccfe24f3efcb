"""querySalesData and the sales data, against SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.support.sql import fetchone
from turnstile.engine.errors import ToolArgumentError
from turnstile.runtime.tools import ToolContext, ToolExecutionError
from turnstile.sales.access import set_query_window
from turnstile.sales.query import (
    EmptyConditionError,
    aggregate_sql,
    run_sales_query,
    statement_timeout,
)
from turnstile.sales.sales_tools import querySalesData
from turnstile.sales.schema import sales_record
from turnstile.sales.seed import BIG_CUSTOMERS, last_week, seed
from turnstile.stores.db import Database
from turnstile.stores.engines import reader_url

# Also listed in tests/conftest.py; repeated so this module stands on its own.
pytest_plugins = ["tests.support.databases"]

TODAY = date(2025, 3, 12)  # a Wednesday: last week is 2025-03-03..2025-03-09
LAST_WEEK = last_week(TODAY)

INJECTIONS = [
    "' OR '1'='1", "' OR 1=1 --", "'; DROP TABLE sales_record; --", "\" OR \"\"=\"",
    "1; DELETE FROM sales_record", "' UNION SELECT * FROM email_task --", "admin'--",
    "' OR 'x'='x'/*", "1' AND SLEEP(5)#", "'; SELECT pg_sleep(5); --", "%' OR '%'='",
    "2025-03-03' OR '1'='1", "2025-03-03; DROP TABLE sales_record", "2025-03-03'--",
    "2025-03-03 OR 1=1", "0x2025", "'||(SELECT customer_email FROM sales_record)||'",
    "') OR ('1'='1", "1)) OR ((1=1", "' AND 1=0 UNION ALL SELECT NULL,NULL--", "`id`",
    "' OR ''='", "\\'; DROP TABLE follow_up_task; --", "%00", "'\x00'", "\n; DELETE FROM x",
    "${7*7}", "{{7*7}}", "$(rm -rf /)", "; ls", "<script>alert(1)</script>", "../../etc/passwd",
    "' OR EXISTS(SELECT 1)--", "1 OR 1=1", "-1 OR 1=1", "' WAITFOR DELAY '0:0:5'--",
    "'; INSERT INTO follow_up_task VALUES (1);--", "'; UPDATE email_task SET status='SENT';--",
    "' HAVING 1=1 --", "' GROUP BY customer_id --", "' ORDER BY 100 --", "ʼ OR 1=1 --",
    "＇ OR １=１", "' OR 1=1 LIMIT 1 --", "'/**/OR/**/1=1", "' oR '1'='1", "'+OR+1=1--",
    "C0001' OR '1'='1", "C0001; DROP TABLE sales_record", "C0001--", "?", "??", "%s",
    "%(x)s", "$1", "'; COPY sales_record TO '/tmp/x'; --", "E'\\x27'", "$$; DROP TABLE x; $$",
    "", " ", "2025-3-3", "2025/03/03", "03/03/2025", "2025-02-30", "2025-03-03T00:00:00",
    "1741000000", "-2025-03-03", "+2025-03-03",
]
assert len(INJECTIONS) >= 50


def ctx_for(db: Database, call_id: str = "call-1") -> ToolContext:
    return ToolContext(db=db, workflow_id="wf-test", conversation_id="c", user_id="u",
                       tool_call_id=call_id)


async def query(db: Database, **arguments: Any) -> Any:
    args = querySalesData.parse_arguments(json.dumps(arguments, default=str))
    return await querySalesData.invoke(ctx_for(db), args)


def rows_of(db: Database, table: str) -> int:
    with db.connect() as conn:
        row = fetchone(conn, f"SELECT COUNT(*) AS n FROM {table}")
    return int(row["n"]) if row else 0


@pytest.fixture(autouse=True)
def all_days_visible(request: pytest.FixtureRequest) -> Iterator[None]:
    """The tests of this module query fixed dates of 2024/2025: on the shared
    PostgreSQL test database, lift the reader's 90-day window while one runs
    (tests/test_tool_roles.py tests the window) and put it back after."""
    if "db" not in request.fixturenames:
        yield
        return
    db: Database = request.getfixturevalue("db")
    if db.dialect != "postgresql":
        yield
        return
    set_query_window(db, None)
    try:
        yield
    finally:
        set_query_window(db, 90)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def seeded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Database]:
    """One seeded database per backend for the read-only tests of this module."""
    if request.param == "postgresql":
        with request.getfixturevalue("postgres_database_factory")() as url:
            db = Database(url)
            seed(db, rows=5000, today=TODAY)
            # Its data is of 2025: lift the reader's 90-day row-level security
            # window on this module's own database (tests/test_tool_roles.py
            # tests the window).
            set_query_window(db, None)
            yield db
    else:
        db = Database(f"sqlite:///{tmp_path_factory.mktemp('sales') / 's.db'}")
        seed(db, rows=5000, today=TODAY)
        yield db


# --- the data ---------------------------------------------------------------------

async def test_last_week_has_a_few_big_customers_and_many_small(seeded: Database) -> None:
    start, end = LAST_WEEK
    over = await query(seeded, startDate=start, endDate=end, minAmount=50000)
    everyone = await query(seeded, startDate=start, endDate=end, minAmount=0)
    assert over.totalCount == BIG_CUSTOMERS == over.returnedCount
    assert everyone.totalCount - over.totalCount >= 40
    amounts = [Decimal(r.totalAmount.replace(",", "")) for r in over.salesRecords]
    assert amounts == sorted(amounts, reverse=True) and min(amounts) > 50000
    first = over.salesRecords[0]
    assert first.customerEmail.endswith(".example.com") and first.orderCount > 0
    assert start.isoformat() <= first.lastOrderDate <= end.isoformat()
    assert over.noDataReason is None and over.periodStart == "2025-03-03"
    assert over.minAmount == "50,000.00"


def test_seed_is_deterministic_and_replaces_rows(tmp_path: Path) -> None:
    def checksum(db: Database) -> tuple[Any, ...]:
        with db.connect() as conn:
            r = fetchone(conn, "SELECT COUNT(*) AS n, SUM(amount_cents) AS s,"
                               " MIN(create_time) AS a, MAX(create_time) AS b FROM sales_record")
        assert r is not None
        return (r["n"], r["s"], r["a"], r["b"])

    one, two = Database(f"sqlite:///{tmp_path}/1.db"), Database(f"sqlite:///{tmp_path}/2.db")
    seed(one, rows=3000, today=TODAY)
    seed(one, rows=3000, today=TODAY)  # again: replaces, does not add
    seed(two, rows=3000, today=TODAY)
    assert checksum(one) == checksum(two)
    assert checksum(one)[0] == 3000
    assert checksum(one)[2] >= "2025-01-15" and checksum(one)[3] < "2025-03-12"


# --- level 1: schema ---------------------------------------------------------------

@pytest.mark.parametrize(("arguments", "fragment"), [
    ({"startDate": "03/03/2025", "endDate": "2025-03-09", "minAmount": 1}, "startDate"),
    ({"startDate": "2025-03-03", "endDate": "2025-02-30", "minAmount": 1}, "endDate"),
    ({"startDate": 1741000000, "endDate": "2025-03-09", "minAmount": 1}, "YYYY-MM-DD"),
    ({"startDate": "2025-03-03", "endDate": "2025-03-09", "minAmount": -5}, "or equal to 0"),
    ({"startDate": "2025-03-03", "endDate": "2025-03-09", "minAmount": "50k"}, "minAmount"),
    ({"startDate": "2025-03-03", "endDate": "2025-03-09"}, "minAmount: Field required"),
    ({"startDate": "2025-03-03", "endDate": "2025-03-09", "minAmount": 1, "sql": "x"}, "sql"),
])
def test_schema_level_rejects_with_actionable_message(arguments: dict[str, Any], fragment: str
                                                      ) -> None:
    with pytest.raises(ToolArgumentError, match="invalid arguments for querySalesData") as err:
        querySalesData.parse_arguments(json.dumps(arguments))
    assert fragment in str(err.value)


# --- level 2: tool -------------------------------------------------------------------

async def test_tool_level_start_after_end(seeded: Database) -> None:
    with pytest.raises(ToolArgumentError, match="is after endDate 2025-03-03: swap them"):
        await query(seeded, startDate="2025-03-09", endDate="2025-03-03", minAmount=1)


async def test_tool_level_range_limit(seeded: Database) -> None:
    with pytest.raises(ToolArgumentError, match="spans 367 days; the limit is 366"):
        await query(seeded, startDate="2024-01-01", endDate="2025-01-01", minAmount=1)
    ok = await query(seeded, startDate="2024-03-13", endDate="2025-03-13", minAmount=0)
    assert ok.totalCount == 60  # 366 days is allowed


# --- level 3: query --------------------------------------------------------------------

@pytest.mark.parametrize(("start", "end"), [(None, "x"), ("x", None), ("", "")])
def test_query_level_refuses_an_unbounded_query(start: str | None, end: str | None) -> None:
    with pytest.raises(EmptyConditionError, match="without a date range"):
        aggregate_sql(start, end)


# --- results the model can't misread ----------------------------------------------------

async def test_no_data_reasons(seeded: Database) -> None:
    future = await query(seeded, startDate="2099-01-01", endDate="2099-01-07", minAmount=0)
    assert future.salesRecords == [] and future.totalCount == 0
    assert "after today" in (future.noDataReason or "")
    empty = await query(seeded, startDate="2020-01-01", endDate="2020-01-07", minAmount=0)
    assert empty.noDataReason == "no sales were recorded between 2020-01-01 and 2020-01-07"
    high = await query(seeded, startDate=LAST_WEEK[0], endDate=LAST_WEEK[1], minAmount=10**9)
    assert high.noDataReason is not None and "no customer's total exceeded" in high.noDataReason
    assert high.minAmount == "1,000,000,000.00"


async def test_more_than_100_matches_returns_top_10_and_true_total(db: Database) -> None:
    with db.connect() as conn:
        conn.executemany(
            sa.insert(sales_record),
            [{"id": i, "customer_id": f"X{i:04d}", "customer_name": f"Customer {i}",
              "customer_email": f"c{i}@example.com", "amount_cents": 100_000 + i,
              "create_time": f"2024-06-0{1 + i % 7}T12:00:00.000000Z"} for i in range(150)],
        )
    result = await query(db, startDate="2024-06-01", endDate="2024-06-07", minAmount=0)
    assert (result.totalCount, result.returnedCount, len(result.salesRecords)) == (150, 10, 10)
    assert result.salesRecords[0].customerId == "X0149"
    assert result.salesRecords[0].totalAmount == "1,001.49"
    assert result.note and "150 customers matched" in result.note
    exactly_100 = await query(db, startDate="2024-06-01", endDate="2024-06-07", minAmount="1000.49")
    assert (exactly_100.totalCount, exactly_100.returnedCount) == (100, 100)


async def test_min_amount_means_strictly_exceeded(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("INSERT INTO sales_record VALUES (1, 'A', 'A', 'a@example.com', 5000000, "
                     "'2024-06-03T00:00:00.000000Z')")
    at = await query(db, startDate="2024-06-03", endDate="2024-06-03", minAmount=50000)
    below = await query(db, startDate="2024-06-03", endDate="2024-06-03", minAmount="49999.999")
    assert at.totalCount == 0 and below.totalCount == 1
    assert below.salesRecords[0].totalAmount == "50,000.00"


# --- safety -------------------------------------------------------------------------------

@pytest.mark.parametrize("param", ["startDate", "endDate"])
async def test_injection_strings_in_dates_are_rejected(seeded: Database, param: str) -> None:
    base = {"startDate": LAST_WEEK[0].isoformat(), "endDate": LAST_WEEK[1].isoformat(),
            "minAmount": 50000}
    for payload in INJECTIONS:
        with pytest.raises(ToolArgumentError, match=f"{param}: "):
            await query(seeded, **{**base, param: payload})


async def test_injection_strings_in_amount_never_return_extra_rows(seeded: Database) -> None:
    period = {"startDate": LAST_WEEK[0].isoformat(), "endDate": LAST_WEEK[1].isoformat()}
    everyone = await query(seeded, **period, minAmount=0)
    known = {r.customerId for r in everyone.salesRecords}
    total = rows_of(seeded, "sales_record")
    accepted = 0
    for payload in INJECTIONS:
        try:
            result = await query(seeded, **period, minAmount=payload)
        except ToolArgumentError:
            continue
        accepted += 1  # a plain number, e.g. "1741000000": a threshold like any other
        assert {r.customerId for r in result.salesRecords} <= known, payload
        assert result.totalCount <= everyone.totalCount
    assert accepted <= 2
    assert rows_of(seeded, "sales_record") == total


def test_write_through_readonly_connection_fails_at_the_database(seeded: Database) -> None:
    for sql in ("DELETE FROM sales_record",
                "UPDATE sales_record SET amount_cents = 0",
                "INSERT INTO follow_up_task (customer_id, assignee, note, status, created_by_call,"
                " created_at) VALUES ('C', 'a', 'n', 'OPEN', 'k', 't')",
                "CREATE TABLE evil (x INTEGER)"):
        with pytest.raises(sa.exc.DBAPIError) as err, seeded.connect(readonly=True) as conn:
            conn.execute(sql)
        # Refused by the database itself (its driver's error), not by our code.
        assert type(err.value.orig).__module__.split(".")[0] in ("sqlite3", "psycopg"), err.value
    assert rows_of(seeded, "sales_record") == 5000


def test_sqlite_reader_cannot_write_through_attach_or_pragmas(seeded: Database,
                                                              tmp_path: Path) -> None:
    if seeded.dialect != "sqlite":
        pytest.skip("SQLite's read-only connection")
    other = tmp_path / "other.db"
    for sql in (f"ATTACH DATABASE '{other}' AS other",
                "ATTACH DATABASE ':memory:' AS scratch",
                "PRAGMA query_only = 0",
                "PRAGMA journal_mode = DELETE",
                "CREATE TEMP TABLE t (x)",
                "DETACH DATABASE main"):
        with pytest.raises(sa.exc.DatabaseError, match="not authorized"), \
                seeded.connect(readonly=True) as conn:
            conn.execute(sql)
    assert not other.exists()  # ATTACH would have created it
    with seeded.connect(readonly=True) as conn:
        assert fetchone(conn, "PRAGMA query_only") == {"query_only": 1}
        assert fetchone(conn, "SELECT COUNT(*) AS n FROM sales_record") == {"n": 5000}


def test_postgres_reader_role_can_only_select_sales(seeded: Database) -> None:
    if seeded.dialect != "postgresql":
        pytest.skip("the SELECT-only role is PostgreSQL's")
    # No read_only session flag here: the privileges alone must stop writes.
    with psycopg.connect(reader_url(seeded.url), autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("turnstile_reader",)
        assert conn.execute("SELECT COUNT(*) FROM sales_record").fetchone() == (5000,)
        for sql in ("DELETE FROM sales_record", "SELECT * FROM email_task",
                    "INSERT INTO follow_up_task (customer_id) VALUES ('x')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)


def test_reader_url_keeps_host_port_database() -> None:
    assert reader_url("postgresql://postgres:pw@db.local:5433/sales?sslmode=require") == (
        "postgresql://turnstile_reader@db.local:5433/sales?sslmode=require")


def test_statement_timeout_stops_a_slow_query(seeded: Database) -> None:
    slow = ("SELECT pg_sleep(2)" if seeded.dialect == "postgresql" else
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000000)"
            " SELECT COUNT(*) FROM n")
    with seeded.connect(readonly=True) as conn:
        with pytest.raises(ToolExecutionError, match="the query took too long") as err:
            with statement_timeout(conn, 0.2):
                conn.execute(slow)
    assert err.value.retryable is True  # retried by the tool's policy


def test_run_sales_query_is_parameterized(seeded: Database) -> None:
    with seeded.connect(readonly=True) as conn:
        result = run_sales_query(conn, *LAST_WEEK, Decimal("50000"), today=TODAY)
    assert result.totalCount == BIG_CUSTOMERS
