"""Least privilege per tool, and indexes for the audit questions.

PostgreSQL:
- the tool roles (NOLOGIN; the application reaches them with `SET LOCAL ROLE`
  inside a tool's transaction): `turnstile_followup` (createFollowUpTask and
  its compensation), `turnstile_email` (createEmailTask: INSERT only),
  `turnstile_sender` (the sender and the e-mail status/retry/cancel paths).
  Made here when the migrating user may (CREATEROLE), and granted to it;
  otherwise the operator makes them (deploy/postgres/init-turnstile.sh does).
  Their table privileges are (re)granted after every upgrade, from the
  tables' `info["grants"]` (turnstile.stores.schema).
- row-level security on `sales_record` and `sales_daily_total`: a role that
  is not their owner (the query tool's reader) sees only the rows of the last
  `turnstile_query_window_start()` days: 90 here, changed with
  `python -m turnstile.db query-window DAYS|off`.
- a CHECK keeps `email_task.recipient` at most 100 characters (NOT VALID:
  rows already there are not re-checked; every new or changed row is).

SQLite: the recipient rule as triggers (SQLite cannot add a CHECK to an
existing table); it has no roles and no row-level security.

Both: indexes on `tool_execution_log` for `starter.py audit`.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import context, op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds roles, indexes, row-level security for the reader and the
# recipient rule: older code runs; only a recipient over 100 characters is
# refused, as a tool error.
compatible_with_previous = True

TOOL_ROLES = ("turnstile_followup", "turnstile_email", "turnstile_sender")
RECIPIENT_MAX = 100
WINDOW_DAYS = 90


def window_function_sql(days: int | None) -> str:
    """The first day (YYYY-MM-DD, UTC) the reader may see; '' = every day."""
    body = ("SELECT ''::text" if days is None else
            "SELECT to_char((now() AT TIME ZONE 'UTC')::date - "
            f"{int(days)}, 'YYYY-MM-DD')")
    return ("CREATE OR REPLACE FUNCTION turnstile_query_window_start() RETURNS text "
            f"LANGUAGE sql STABLE AS $$ {body} $$")


def _make_role(role: str) -> str:
    return f"""DO $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
            BEGIN
                CREATE ROLE {role} NOLOGIN;
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN NULL;
                WHEN insufficient_privilege THEN
                    RAISE NOTICE 'cannot create role {role}: the operator makes it';
            END;
        END IF;
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}')
           AND NOT pg_has_role(current_user, '{role}', 'MEMBER') THEN
            BEGIN
                EXECUTE 'GRANT {role} TO ' || quote_ident(current_user);
            EXCEPTION
                WHEN insufficient_privilege OR invalid_grant_operation THEN
                    RAISE NOTICE 'cannot grant {role} to the application: the operator does';
            END;
        END IF;
    END
    $$"""


def serves_sales() -> bool:
    """Are the sales app's tables made? The reference app's tables were
    made by these revisions before apps were chosen (TURNSTILE_APPS); a
    database migrated for other apps only leaves them out
    (turnstile.stores.schema passes the served apps; None: every app)."""
    apps = context.config.attributes.get("apps")
    return apps is None or "sales" in apps


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    op.create_index("tool_execution_log_time", "tool_execution_log",
                    ["start_time", "user_id", "tool_name", "status"])
    op.create_index("tool_execution_log_status_time", "tool_execution_log",
                    ["status", "start_time"])
    if not serves_sales():
        return
    if not pg:
        for event in ("INSERT", "UPDATE OF recipient"):
            name = "insert" if event == "INSERT" else "update"
            op.execute(
                f"CREATE TRIGGER email_task_recipient_length_{name} BEFORE {event} ON email_task"
                f" WHEN length(NEW.recipient) > {RECIPIENT_MAX} BEGIN"
                " SELECT RAISE(ABORT, 'CHECK constraint failed: email_task_recipient_length');"
                " END")
        return
    op.execute("ALTER TABLE email_task ADD CONSTRAINT email_task_recipient_length "
               f"CHECK (char_length(recipient) <= {RECIPIENT_MAX}) NOT VALID")
    for role in TOOL_ROLES:
        op.execute(_make_role(role))
    op.execute(window_function_sql(WINDOW_DAYS))
    for table, column in (("sales_record", "create_time"), ("sales_daily_total", "day")):
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {table}_recent ON {table} FOR SELECT "
                   f"USING ({column} >= turnstile_query_window_start())")


def downgrade() -> None:
    raise NotImplementedError("0004: restore a backup to go back")
