"""Tables of the sales reference application (docs/contract.md, "Tables").

Timestamps are ISO-8601 UTC text of fixed width (`2025-03-03T09:15:00.000000Z`)
on BOTH backends. Fixed width + UTC + the "C" collation on PostgreSQL make
text order equal time order, so one SQL text and one Python value type serve
SQLite and PostgreSQL alike (no datetime-vs-str split in the tools).

Amounts are integer cents. On PostgreSQL a LOGIN role `turnstile_reader` with
SELECT on `sales_record` and its rollup `sales_daily_total` only backs
`Database.connect(readonly=True)`; row-level security shows it the last 90
days only. The other sales tools run as their own roles (turnstile.sales.access).

`sales_daily_total` holds one row per (UTC day, customer): the sum, count and
latest time of that customer's orders that day. Triggers on `sales_record` keep
it exact (an insert adds to its row; a delete or update recomputes the rows it
touched from `sales_record`), so the one-week query reads ~7 x customers rows
instead of every order of the week. The tables and triggers are made by the
migrations (turnstile/migrations); `rollup_rebuild` serves the bulk
loader (`seed`), which sets the triggers aside while it loads.

The tables are declared on the app's own `metadata` and handed to the
runtime in the app (`TABLES`; turnstile.sales.app), with the privileges
their `info` names; nothing finds them by importing this module.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time

import sqlalchemy as sa

from turnstile.outbox import Outbox
from turnstile.stores.timestamps import Ts, now_text as now_text, utc_text as utc_text

# The sales app's tables (the stores declare theirs on turnstile.stores.tables.metadata).
metadata = sa.MetaData()

SALES_INDEX = "sales_record_time_amount_idx"

# The PostgreSQL roles of the sales tools (migration 0004; turnstile.sales.access).
FOLLOWUP_ROLE = "turnstile_followup"
EMAIL_ROLE = "turnstile_email"
SENDER_ROLE = "turnstile_sender"


sales_record = sa.Table(
    "sales_record", metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
              autoincrement=False),
    sa.Column("customer_id", sa.Text, nullable=False),
    sa.Column("customer_name", sa.Text, nullable=False),
    sa.Column("customer_email", sa.Text, nullable=False),
    sa.Column("amount_cents", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
              sa.CheckConstraint("amount_cents >= 0"), nullable=False),
    sa.Column("create_time", Ts, nullable=False),
    info={"reader": True},  # the read-only role may SELECT it (turnstile.runtime.apps)
)
# The bulk loader drops and rebuilds it around a load (turnstile.sales.seed).
sales_index = sa.Index(SALES_INDEX, sales_record.c.create_time, sales_record.c.amount_cents)

# Who may decide approvals of the service's calls (turnstile.sales.approvers;
# migration 0003). `tool` is a tool name, or "*" for every tool.
approver = sa.Table(
    "approver", metadata,
    sa.Column("service", sa.Text, primary_key=True),
    sa.Column("tool", sa.Text, primary_key=True),
    sa.Column("reviewer", sa.Text, primary_key=True),
)

sales_daily_total = sa.Table(
    "sales_daily_total", metadata,
    sa.Column("day", Ts, primary_key=True),  # YYYY-MM-DD (UTC)
    sa.Column("customer_id", sa.Text, primary_key=True),
    sa.Column("customer_name", sa.Text, nullable=False),  # MAX over the day's orders
    sa.Column("customer_email", sa.Text, nullable=False),  # MAX over the day's orders
    sa.Column("total_cents", sa.BigInteger, nullable=False),
    sa.Column("order_count", sa.BigInteger, nullable=False),
    sa.Column("last_time", Ts, nullable=False),
    info={"reader": True},
)

follow_up_task = sa.Table(
    "follow_up_task", metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), sa.Identity(),
              primary_key=True),
    sa.Column("customer_id", sa.Text, nullable=False),
    sa.Column("assignee", sa.Text, nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="OPEN"),
    sa.Column("created_by_call", sa.Text, nullable=False),
    sa.Column("created_at", Ts, nullable=False),
    sa.UniqueConstraint("created_by_call", "customer_id"),
    sqlite_autoincrement=True,
    # PostgreSQL: createFollowUpTask inserts and reads back its rows; its
    # compensation updates them (turnstile.sales.access).
    info={"grants": {FOLLOWUP_ROLE: "SELECT, INSERT, UPDATE"}},
)

# The outbox of createEmailTask (the public one, turnstile.outbox): createEmailTask
# may only insert; every state change (sender, status, retry, cancel) goes
# through the sender's role. A CHECK (migration 0004; triggers on SQLite) keeps
# recipient <= 100 characters. The revisions make the table (0001).
EMAIL_OUTBOX = Outbox("email_task", metadata=metadata, insert_role=EMAIL_ROLE,
                      sender_role=SENDER_ROLE)
email_task = EMAIL_OUTBOX.table


# What the app hands the runtime (turnstile.sales.app).
TABLES = (sales_record, approver, sales_daily_total, follow_up_task, email_task)


def day_start_text(day: date) -> str:
    """Midnight UTC of `day`, in the stored form (an inclusive lower bound)."""
    return utc_text(datetime.combine(day, time.min, tzinfo=UTC))


def rollup_rebuild() -> sa.Insert:
    """Recompute every `sales_daily_total` row from `sales_record` (after a bulk
    load with the triggers set aside; the table must be empty)."""
    r = sales_record.c
    day = sa.func.substr(r.create_time, 1, 10)
    return sa.insert(sales_daily_total).from_select(
        ["day", "customer_id", "customer_name", "customer_email", "total_cents", "order_count",
         "last_time"],
        sa.select(day, r.customer_id, sa.func.max(r.customer_name),
                  sa.func.max(r.customer_email), sa.func.sum(r.amount_cents), sa.func.count(),
                  sa.func.max(r.create_time))
        .group_by(day, r.customer_id))
