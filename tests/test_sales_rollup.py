"""`sales_daily_total` stays exactly what `sales_record` says, whatever
writes the sales rows (inserts, updates that move an order to another day or
customer, deletes), including after `seed` set its triggers aside for a bulk
load — on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import date
from typing import Any

from tests.support.sql import fetchall, fetchone
from turnstile.sales.seed import seed
from turnstile.stores.db import Database


def rollup(db: Database) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, "SELECT * FROM sales_daily_total ORDER BY day, customer_id")


def recomputed(db: Database) -> list[dict[str, Any]]:
    """What the rollup must hold, computed from `sales_record` by a plain query."""
    with db.connect() as conn:
        return fetchall(conn,
            "SELECT substr(create_time, 1, 10) AS day, customer_id,"
            " MAX(customer_name) AS customer_name, MAX(customer_email) AS customer_email,"
            " SUM(amount_cents) AS total_cents, COUNT(*) AS order_count,"
            " MAX(create_time) AS last_time FROM sales_record"
            " GROUP BY substr(create_time, 1, 10), customer_id ORDER BY day, customer_id")


def test_triggers_keep_the_rollup_exact(db: Database) -> None:
    seed(db, rows=2000, today=date(2025, 3, 12))
    assert rollup(db) == recomputed(db) and len(rollup(db)) > 100
    with db.connect() as conn:
        conn.execute("INSERT INTO sales_record VALUES (900001, 'C0001', 'Zed Corp', "
                     "'zed@example.com', 123, '2025-03-03T23:59:59.999999Z')")
        conn.execute("INSERT INTO sales_record VALUES (900002, 'NEW1', 'New', "
                     "'new@example.com', 5, '2025-03-04T00:00:00.000000Z')")
    assert rollup(db) == recomputed(db)
    with db.connect() as conn:  # to another day, another customer, another amount
        conn.execute("UPDATE sales_record SET create_time = '2025-03-05T08:00:00.000000Z', "
                     "customer_id = 'NEW1', amount_cents = amount_cents + 7 WHERE id = 900001")
        conn.execute("UPDATE sales_record SET amount_cents = 0 WHERE id IN (1, 2, 3)")
    assert rollup(db) == recomputed(db)
    with db.connect() as conn:
        conn.execute("DELETE FROM sales_record WHERE customer_id = 'NEW1'")
        conn.execute("DELETE FROM sales_record WHERE id % 7 = 0")
    after = rollup(db)
    assert after == recomputed(db)
    assert not [r for r in after if r["customer_id"] == "NEW1"]  # emptied rows are gone
    with db.connect() as conn:
        total = fetchone(conn, "SELECT COUNT(*) AS n, SUM(amount_cents) AS c FROM sales_record")
    assert total == {"n": sum(r["order_count"] for r in after),
                     "c": sum(r["total_cents"] for r in after)}
