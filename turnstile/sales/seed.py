"""Deterministic demo data for `sales_record`.

The same (rows, today) always produce the same rows. Sales are spread over the
56 days before `today`. Each customer has a weekly sales target; last week's
(Monday..Sunday before the current week) totals follow the targets exactly in
expectation, so "customers over 50,000.00 last week" has a stable answer:
`BIG_CUSTOMERS` customers well above it, the rest well below. Other weeks vary
by +-30 % so other periods give other answers.

Amounts are per-order; since the number of orders grows with `rows`, the mean
order size shrinks accordingly so weekly totals stay in the same range for
5,000 or 1,000,000 rows.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import REGCLASS

from turnstile.sales.schema import (
    TABLES,
    rollup_rebuild,
    sales_daily_total,
    sales_index,
    sales_record,
)
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.schema import upgrade

log = logging.getLogger(__name__)

SEED = 20_240_601
CUSTOMER_COUNT = 60
BIG_CUSTOMERS = 8  # weekly targets 60,000-150,000; the rest 3,000-40,000
PERIOD_DAYS = 56
BATCH = 50_000

_COLUMNS = "id, customer_id, customer_name, customer_email, amount_cents, create_time"

_FIRST = [
    "Acme", "Northwind", "Globex", "Initech", "Umbrella", "Stark", "Wayne", "Hooli",
    "Vandelay", "Soylent", "Tyrell", "Cyberdyne", "Wonka", "Gringotts", "Oscorp",
    "Aperture", "Massive", "Dunder", "Pied Piper", "Monarch",
]
_SECOND = ["Logistics", "Foods", "Industries", "Retail", "Labs", "Holdings"]


@dataclass(frozen=True)
class Customer:
    id: str
    name: str
    email: str
    weekly_target_cents: int
    share: float  # fraction of all orders


def last_week(today: date) -> tuple[date, date]:
    """Monday..Sunday of the week before the one containing `today`."""
    start = today - timedelta(days=today.weekday() + 7)
    return start, start + timedelta(days=6)


def demo_customers() -> list[Customer]:
    rng = random.Random(SEED)
    names = [f"{a} {b}" for a in _FIRST for b in _SECOND]
    rng.shuffle(names)
    weights = [rng.uniform(0.5, 1.5) for _ in range(CUSTOMER_COUNT)]
    total_weight = sum(weights)
    customers = []
    for i in range(CUSTOMER_COUNT):
        name = names[i]
        big = i < BIG_CUSTOMERS
        target = rng.randint(60_000, 150_000) if big else rng.randint(3_000, 40_000)
        slug = name.lower().replace(" ", "-")
        customers.append(
            Customer(
                id=f"C{i + 1:04d}",
                name=name,
                email=f"purchasing@{slug}.example.com",
                weekly_target_cents=target * 100,
                share=weights[i] / total_weight,
            )
        )
    return customers


Row = tuple[int, str, str, str, int, str]


def _rows(rows: int, today: date) -> Iterator[Row]:
    """Rows in time order, one calendar week at a time. Within a week each
    customer's order amounts are scaled so they sum to its target for that
    week: totals then do not depend on how many orders the dice gave it."""
    rng = random.Random(SEED + 1)
    customers = demo_customers()
    cumulative = list(itertools.accumulate(c.share for c in customers))
    last = len(customers) - 1
    first = today - timedelta(days=PERIOD_DAYS)
    lw_start, _ = last_week(today)
    row_id = 0
    d = 0
    while d < PERIOD_DAYS:
        week_start = first + timedelta(days=d)
        span = min(7 - week_start.weekday(), PERIOD_DAYS - d)  # days of this week in the period
        factor = 1.0 if week_start == lw_start else None
        targets = [
            c.weekly_target_cents * (factor or rng.uniform(0.7, 1.3)) * span / 7
            for c in customers
        ]
        count = rows * (d + span) // PERIOD_DAYS - rows * d // PERIOD_DAYS
        orders = []
        weight_sum = [0.0] * len(customers)
        seconds = span * 86_400
        rand = rng.random  # hot loop: plain random() calls, no uniform()/randrange()
        for _ in range(count):
            ci = min(bisect.bisect_left(cumulative, rand() * cumulative[-1]), last)
            w = 0.4 + 1.2 * rand()
            weight_sum[ci] += w
            orders.append((int(rand() * seconds), ci, w))
        orders.sort()  # time order: friendlier to the (create_time, ...) index
        prefixes = [f"{week_start + timedelta(days=i)}T" for i in range(span)]
        scale = [t / w if w else 0.0 for t, w in zip(targets, weight_sum, strict=True)]
        for offset, ci, w in orders:
            c = customers[ci]
            day, s = divmod(offset, 86_400)
            h, s = divmod(s, 3600)
            m, s = divmod(s, 60)
            row_id += 1
            yield (
                row_id, c.id, c.name, c.email, max(1, round(w * scale[ci])),
                f"{prefixes[day]}{h:02d}:{m:02d}:{s:02d}.000000Z",
            )
        d += span


def _copy_postgres(conn: Connection, rows: int, today: date) -> None:
    with conn.raw.cursor() as cur:
        with cur.copy(f"COPY sales_record ({_COLUMNS}) FROM STDIN") as copy:
            for row in _rows(rows, today):
                copy.write_row(row)


def _insert_sqlite(conn: Connection, rows: int, today: date) -> None:
    # The driver's own executemany: the fastest bulk path SQLite has.
    sql = f"INSERT INTO sales_record ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
    it = _rows(rows, today)
    while batch := list(itertools.islice(it, BATCH)):
        conn.sa.exec_driver_sql(sql, batch)


# The catalogs that list triggers.
_pg_trigger = sa.table("pg_trigger", sa.column("oid"), sa.column("tgname"),
                       sa.column("tgrelid"), sa.column("tgisinternal"))
_sqlite_master = sa.table("sqlite_master", sa.column("name"), sa.column("sql"),
                          sa.column("type"), sa.column("tbl_name"))


def _take_rollup_triggers(conn: Connection) -> list[str]:
    """Drop the triggers on `sales_record`; return the DDL that recreates them."""
    quote = conn.sa.dialect.identifier_preparer.quote
    if conn.dialect == "postgresql":
        pg = _pg_trigger.c
        found = conn.sa.execute(
            sa.select(pg.tgname, sa.func.pg_get_triggerdef(pg.oid))
            .where(pg.tgrelid == sa.cast(sa.literal(sales_record.name), REGCLASS),
                   sa.not_(pg.tgisinternal))).all()
        drop = "DROP TRIGGER {} ON " + quote(sales_record.name)
    else:
        lite = _sqlite_master.c
        found = conn.sa.execute(
            sa.select(lite.name, lite.sql)
            .where(lite.type == "trigger", lite.tbl_name == sales_record.name)).all()
        drop = "DROP TRIGGER {}"
    # DDL: no SQLAlchemy construct drops a trigger.
    for name, _ddl in found:
        conn.execute(drop.format(quote(str(name))))
    return [str(ddl) for _name, ddl in found]


def seed(db: Database, rows: int = 100_000, today: date | None = None) -> int:
    """Replace every `sales_record` row with `rows` deterministic demo rows,
    dated in the PERIOD_DAYS days before `today` (UTC today by default).
    Returns the number of rows written."""
    if rows < 0:
        raise ValueError("rows must be >= 0")
    today = today or datetime.now(UTC).date()
    upgrade(db, tables=TABLES)
    with db.connect() as conn:
        # One transaction: readers see the old data or the new, never a mix.
        # Building the index and the per-day rollup once after the load is
        # several times faster than maintaining them row by row, so the
        # rollup's triggers are set aside meanwhile (exactly as the
        # migrations made them) and put back before the commit.
        triggers = _take_rollup_triggers(conn)
        conn.execute(sa.delete(sales_daily_total))
        if db.dialect == "postgresql":
            conn.execute("TRUNCATE sales_record")  # no Core construct; far faster than DELETE
        else:
            conn.execute(sa.delete(sales_record))
        conn.execute(sa.schema.DropIndex(sales_index, if_exists=True))
        if db.dialect == "postgresql":
            _copy_postgres(conn, rows, today)
        else:
            _insert_sqlite(conn, rows, today)
        conn.execute(sa.schema.CreateIndex(sales_index, if_not_exists=True))
        conn.execute(rollup_rebuild())
        for ddl in triggers:
            conn.execute(sa.text(ddl))
        for table in (sales_record, sales_daily_total):  # no Core construct for ANALYZE
            conn.execute(f"ANALYZE {table.name}")
    log.info("seeded %d sales_record rows (%d days before %s)", rows, PERIOD_DAYS, today)
    return rows
