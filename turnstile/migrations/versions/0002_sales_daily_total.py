"""`sales_daily_total`: per (UTC day, customer) totals of `sales_record`,
kept exact by triggers, so the one-week sales query reads a few hundred rows
instead of every order of the week. Filled from the existing rows here. (The
read-only role's SELECT on it is granted after every upgrade, see
turnstile.stores.schema.)

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds a table and the triggers that keep it: older code writes
# sales_record as before.
compatible_with_previous = True

TS = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
COLUMNS = "day, customer_id, customer_name, customer_email, total_cents, order_count, last_time"

# The rows of one (day, customer) recomputed from sales_record: the day's
# orders are the create_time range [day || 'T', day || 'U') ("T" separates
# date and time in the stored form), which the (create_time, ...) index serves.
_RECOMPUTE = f"""
    DELETE FROM sales_daily_total WHERE day = {{day}} AND customer_id = {{cust}};
    INSERT INTO sales_daily_total ({COLUMNS})
        SELECT {{day}}, customer_id, MAX(customer_name), MAX(customer_email),
               SUM(amount_cents), COUNT(*), MAX(create_time)
        FROM sales_record
        WHERE customer_id = {{cust}}
          AND create_time >= {{day}} || 'T' AND create_time < {{day}} || 'U'
        GROUP BY customer_id;"""

_ADD_SQLITE = f"""
    INSERT INTO sales_daily_total ({COLUMNS})
    VALUES (substr(NEW.create_time, 1, 10), NEW.customer_id, NEW.customer_name,
            NEW.customer_email, NEW.amount_cents, 1, NEW.create_time)
    ON CONFLICT (day, customer_id) DO UPDATE SET
        customer_name = max(customer_name, excluded.customer_name),
        customer_email = max(customer_email, excluded.customer_email),
        total_cents = total_cents + excluded.total_cents,
        order_count = order_count + 1,
        last_time = max(last_time, excluded.last_time);"""


def _sqlite_triggers() -> list[str]:
    old = _RECOMPUTE.format(day="substr(OLD.create_time, 1, 10)", cust="OLD.customer_id")
    new = _RECOMPUTE.format(day="substr(NEW.create_time, 1, 10)", cust="NEW.customer_id")
    return [
        f"CREATE TRIGGER sales_rollup_insert AFTER INSERT ON sales_record BEGIN {_ADD_SQLITE}"
        " END",
        f"CREATE TRIGGER sales_rollup_delete AFTER DELETE ON sales_record BEGIN {old} END",
        f"CREATE TRIGGER sales_rollup_update AFTER UPDATE ON sales_record BEGIN {old} {new} END",
    ]


def _postgresql_triggers() -> list[str]:
    recompute = _RECOMPUTE.format(day="d", cust="c")
    return [
        f"""CREATE FUNCTION sales_rollup_recompute(d text, c text) RETURNS void
        LANGUAGE sql AS $$ {recompute} $$""",
        f"""CREATE FUNCTION sales_rollup() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO sales_daily_total ({COLUMNS})
                VALUES (substr(NEW.create_time, 1, 10), NEW.customer_id, NEW.customer_name,
                        NEW.customer_email, NEW.amount_cents, 1, NEW.create_time)
                ON CONFLICT (day, customer_id) DO UPDATE SET
                    customer_name = GREATEST(sales_daily_total.customer_name,
                                             excluded.customer_name),
                    customer_email = GREATEST(sales_daily_total.customer_email,
                                              excluded.customer_email),
                    total_cents = sales_daily_total.total_cents + excluded.total_cents,
                    order_count = sales_daily_total.order_count + 1,
                    last_time = GREATEST(sales_daily_total.last_time, excluded.last_time);
                RETURN NULL;
            END IF;
            PERFORM sales_rollup_recompute(substr(OLD.create_time, 1, 10), OLD.customer_id);
            IF TG_OP = 'UPDATE' THEN
                PERFORM sales_rollup_recompute(substr(NEW.create_time, 1, 10), NEW.customer_id);
            END IF;
            RETURN NULL;
        END $$""",
        """CREATE TRIGGER sales_rollup AFTER INSERT OR UPDATE OR DELETE ON sales_record
        FOR EACH ROW EXECUTE FUNCTION sales_rollup()""",
    ]


def serves_sales() -> bool:
    """Are the sales app's tables made? The reference app's tables were
    made by these revisions before apps were chosen (TURNSTILE_APPS); a
    database migrated for other apps only leaves them out
    (turnstile.stores.schema passes the served apps; None: every app)."""
    apps = context.config.attributes.get("apps")
    return apps is None or "sales" in apps


def upgrade() -> None:
    if not serves_sales():
        return
    pg = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "sales_daily_total",
        sa.Column("day", TS, nullable=False),
        sa.Column("customer_id", sa.Text, nullable=False),
        sa.Column("customer_name", sa.Text, nullable=False),
        sa.Column("customer_email", sa.Text, nullable=False),
        sa.Column("total_cents", sa.BigInteger, nullable=False),
        sa.Column("order_count", sa.BigInteger, nullable=False),
        sa.Column("last_time", TS, nullable=False),
        sa.PrimaryKeyConstraint("day", "customer_id"),
    )
    op.execute(
        f"INSERT INTO sales_daily_total ({COLUMNS}) "
        "SELECT substr(create_time, 1, 10), customer_id, MAX(customer_name), "
        "MAX(customer_email), SUM(amount_cents), COUNT(*), MAX(create_time) "
        "FROM sales_record GROUP BY substr(create_time, 1, 10), customer_id"
    )
    for stmt in _postgresql_triggers() if pg else _sqlite_triggers():
        op.execute(stmt)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER sales_rollup ON sales_record")
        op.execute("DROP FUNCTION sales_rollup()")
        op.execute("DROP FUNCTION sales_rollup_recompute(text, text)")
    else:
        for name in ("sales_rollup_insert", "sales_rollup_delete", "sales_rollup_update"):
            op.execute(f"DROP TRIGGER {name}")
    op.drop_table("sales_daily_total")
