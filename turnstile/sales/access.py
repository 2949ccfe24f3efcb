"""How each sales tool reaches the database: its own role, a statement
timeout — the helpers live in turnstile.runtime.tool_access (the public
outbox, turnstile.outbox, uses them too); this module names them for the
sales app and holds the query tool's window (row-level security).

PostgreSQL roles of the sales tools (migration 0004, granted after each
upgrade from the tables' `info["grants"]`):

- `turnstile_reader` (LOGIN): querySalesData, createFollowUpTask's customer
  check: SELECT sales_record and sales_daily_total, rows of the last 90 days
  only (row-level security);
- `turnstile_followup`: createFollowUpTask and its compensation: SELECT,
  INSERT, UPDATE follow_up_task;
- `turnstile_email`: createEmailTask: INSERT email_task;
- `turnstile_sender`: the sender, getEmailTaskStatus, retryEmailTask, the
  cancel compensation: SELECT, UPDATE email_task.
"""

from __future__ import annotations

from turnstile.runtime.tool_access import (
    QueryTooLong as QueryTooLong,
    ToolRoleUnavailable as ToolRoleUnavailable,
    as_role as as_role,
    statement_timeout as statement_timeout,
    tool_connection as tool_connection,
    tool_transaction as tool_transaction,
    unprivileged_allowed as unprivileged_allowed,
)
from turnstile.stores.db import Database


def set_query_window(db: Database, days: int | None) -> None:
    """How many days back the query tool's role sees sales (None: all of
    them). PostgreSQL only: it replaces the function the row-level security
    policies of sales_record and sales_daily_total call."""
    if db.dialect != "postgresql":
        raise ValueError("the query window is row-level security: PostgreSQL only")
    if days is not None and days < 0:
        raise ValueError("the query window is a number of days >= 0")
    with db.connect() as conn:
        conn.execute(window_function_sql(days))


def window_function_sql(days: int | None) -> str:
    """The first day (YYYY-MM-DD, UTC) the reader may see; '' = every day.
    (Migration 0004 holds a frozen copy.)"""
    body = ("SELECT ''::text" if days is None else
            "SELECT to_char((now() AT TIME ZONE 'UTC')::date - "
            f"{int(days)}, 'YYYY-MM-DD')")
    return ("CREATE OR REPLACE FUNCTION turnstile_query_window_start() RETURNS text "
            f"LANGUAGE sql STABLE AS $$ {body} $$")
