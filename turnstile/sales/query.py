"""The sales query behind `querySalesData`: validation, SQL, result shape.

Three validation levels, each with a message the model can act on:

1. schema   — pydantic types on the tool's parameters (`IsoDate`, `Money`):
              ISO `YYYY-MM-DD` dates only, amounts >= 0;
2. tool     — `check_period`: start <= end, at most `MAX_RANGE_DAYS` days;
3. query    — `aggregate_sql` refuses to build a query without a time range,
              so no code path can turn into a full-table scan. It reads the
              per-day rollup `sales_daily_total` (see turnstile.sales.schema).

The model never sends SQL: values only reach the database as bound parameters
through a read-only connection (on PostgreSQL its role sees the last 90 days
only), under a statement timeout (turnstile.sales.access).
"""

from __future__ import annotations

import re
from datetime import date
from decimal import ROUND_FLOOR, Decimal
from typing import Annotated, Any, NamedTuple

import sqlalchemy as sa
from pydantic import BaseModel, BeforeValidator, Field

from turnstile.engine.errors import ToolArgumentError
from turnstile.engine.specs import DEFAULT_STATEMENT_TIMEOUT_SECONDS
from turnstile.sales.access import statement_timeout
from turnstile.sales.schema import sales_daily_total
from turnstile.stores.connection import Connection

MAX_RANGE_DAYS = 366
FULL_LIST_LIMIT = 100  # up to this many matches are all returned...
TRUNCATED_LIMIT = 10  # ...beyond it only the top ones, with the true total
QUERY_TIMEOUT_SECONDS = DEFAULT_STATEMENT_TIMEOUT_SECONDS
MAX_AMOUNT = Decimal("1000000000000")  # keeps cents inside BIGINT

_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_date_only(value: Any) -> Any:
    # pydantic's lax date parsing also takes Unix timestamps and datetimes;
    # the model must say a calendar day, unambiguously.
    if isinstance(value, date):
        return value
    if isinstance(value, str) and _ISO_DATE.fullmatch(value):
        return value  # pydantic still checks that the day exists
    raise ValueError(f"expected an ISO date YYYY-MM-DD such as 2025-03-03, got {value!r:.60}")


IsoDate = Annotated[date, BeforeValidator(_iso_date_only)]
# Bounded digits: `1e-1000000` is an argument error, never a million-digit
# number formatted back into every later request (sub-cent thresholds stay valid).
Money = Annotated[Decimal, Field(ge=0, le=MAX_AMOUNT, max_digits=20, decimal_places=6)]


class SalesRecord(BaseModel):
    customerId: str
    customerName: str
    customerEmail: str
    totalAmount: str = Field(description="sum over the period, formatted, e.g. 52,340.00")
    orderCount: int
    lastOrderDate: str = Field(description="YYYY-MM-DD (UTC) of the latest order in the period")


class SalesQueryResult(BaseModel):
    """Explicit fields, pre-formatted values: nothing for the model to compute."""

    periodStart: str
    periodEnd: str
    minAmount: str
    salesRecords: list[SalesRecord]
    totalCount: int = Field(description="customers matching, even when not all are returned")
    returnedCount: int
    noDataReason: str | None = None
    note: str | None = None


def format_cents(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    whole, rest = divmod(abs(int(cents)), 100)
    return f"{sign}{whole:,}.{rest:02d}"


def floor_cents(amount: Decimal) -> int:
    # total > amount  <=>  total_cents > floor(amount * 100) for integer cents
    return int((amount * 100).to_integral_value(rounding=ROUND_FLOOR))


def check_period(start: date, end: date) -> None:
    """Tool-level validation (level 2)."""
    if start > end:
        raise ToolArgumentError(
            f"startDate {start} is after endDate {end}: swap them, or give the first day "
            "of the period as startDate and the last day as endDate (both inclusive)"
        )
    days = (end - start).days + 1
    if days > MAX_RANGE_DAYS:
        raise ToolArgumentError(
            f"the period {start}..{end} spans {days} days; the limit is {MAX_RANGE_DAYS}. "
            "Query at most one year at a time and combine the results"
        )


class EmptyConditionError(ToolArgumentError):
    """A query without a restricting condition would scan the whole table."""


def aggregate_sql(start_day: str | None,
                  end_day: str | None) -> tuple[sa.Select[Any], dict[str, str]]:
    """Per-customer totals over the days [start_day, end_day] (level 3), from
    the per-day rollup `sales_daily_total`: about 7 x customers rows for a
    week, whatever the number of orders: the statement (built once) and its
    period's parameters. The caller binds `threshold` (cents, a total must
    exceed it) and `limit`.
    """
    if not start_day or not end_day:
        raise EmptyConditionError(
            "refusing to query sales without a date range (it would scan every sale): "
            "give startDate and endDate"
        )
    return _AGGREGATE, {"start_day": start_day, "end_day": end_day}


def _aggregate_statement() -> sa.Select[Any]:
    t = sales_daily_total
    total = sa.func.sum(t.c.total_cents)
    # COUNT(*) OVER () counts the groups that passed HAVING: the true total
    # even though at most `limit` rows come back.
    return (
        sa.select(
            t.c.customer_id,
            sa.func.max(t.c.customer_name).label("customer_name"),
            sa.func.max(t.c.customer_email).label("customer_email"),
            total.label("total_cents"),
            sa.func.sum(t.c.order_count).label("order_count"),
            sa.func.max(t.c.last_time).label("last_order"),
            sa.func.count().over().label("matching"),
        )
        .where(t.c.day >= sa.bindparam("start_day"), t.c.day <= sa.bindparam("end_day"))
        .group_by(t.c.customer_id)
        .having(total > sa.bindparam("threshold"))
        .order_by(sa.desc("total_cents"), t.c.customer_id)
        .limit(sa.bindparam("limit"))
    )


class _CustomerTotal(NamedTuple):
    """A row of the aggregate statement."""

    customer_id: str
    customer_name: str
    customer_email: str
    total_cents: int
    order_count: int
    last_order: str
    matching: int


def _orders_statement() -> sa.Select[Any]:
    t = sales_daily_total
    return sa.select(sa.func.coalesce(sa.func.sum(t.c.order_count), 0).label("n")).where(
        t.c.day >= sa.bindparam("start_day"), t.c.day <= sa.bindparam("end_day"))


# Built once: a statement is constructed in Python on every call otherwise
# (SQLAlchemy caches its compiled form, not the construction).
_AGGREGATE = _aggregate_statement()
_ORDERS = _orders_statement()


def run_sales_query(
    conn: Connection,
    start: date,
    end: date,
    min_amount: Decimal,
    *,
    today: date,
    timeout_seconds: float = QUERY_TIMEOUT_SECONDS,
) -> SalesQueryResult:
    check_period(start, end)
    start_day, end_day = start.isoformat(), end.isoformat()  # both days inclusive
    threshold = floor_cents(min_amount)
    with statement_timeout(conn, timeout_seconds):
        statement, period = aggregate_sql(start_day, end_day)
        rows = [_CustomerTotal._make(r) for r in conn.execute(
            statement, {**period, "threshold": threshold, "limit": FULL_LIST_LIMIT + 1})]
        orders_in_period = None
        if not rows:
            orders_in_period = int(conn.execute(_ORDERS, period).scalar_one())
    total = int(rows[0].matching) if rows else 0
    shown = rows if total <= FULL_LIST_LIMIT else rows[:TRUNCATED_LIMIT]
    records = [
        SalesRecord(
            customerId=r.customer_id,
            customerName=r.customer_name,
            customerEmail=r.customer_email,
            totalAmount=format_cents(int(r.total_cents)),
            orderCount=int(r.order_count),
            lastOrderDate=str(r.last_order)[:10],
        )
        for r in shown
    ]
    min_text = format_cents(threshold) if min_amount * 100 == threshold else f"{min_amount:,f}"
    result = SalesQueryResult(
        periodStart=start.isoformat(),
        periodEnd=end.isoformat(),
        minAmount=min_text,
        salesRecords=records,
        totalCount=total,
        returnedCount=len(records),
    )
    if total > FULL_LIST_LIMIT:
        result.note = (
            f"{total} customers matched; only the top {TRUNCATED_LIMIT} by total are listed. "
            "Raise minAmount or shorten the period to see all of them"
        )
    if orders_in_period is not None:
        result.noDataReason = _no_data_reason(start, end, today, orders_in_period, min_text)
    return result


def _no_data_reason(start: date, end: date, today: date, orders: int, min_text: str) -> str:
    if start > today:
        return f"the period starts after today ({today}); there are no future sales"
    if orders == 0:
        return f"no sales were recorded between {start} and {end}"
    return (
        f"{orders} orders were recorded between {start} and {end}, "
        f"but no customer's total exceeded {min_text}"
    )
