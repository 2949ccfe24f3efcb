"""Audit questions on a large audit log: `starter.py audit` query times.

    .venv/bin/python -m bench.audit                 # 2,000,000 rows
    .venv/bin/python -m bench.audit --rows 200000

For SQLite (a temporary file) and, when it answers, PostgreSQL (a database
`turnstile_audit_bench_<hex>` created on the server of --postgres-url and
dropped afterwards): migrate to the newest schema (the indexes of migration
0004 included), load N deterministic `tool_execution_log` rows spread over
--days days up to now (200 users, one heavy user calling querySalesData ~5%
of all calls; 8% failures across the error categories), ANALYZE, then time
each question of `turnstile.stores.audit_queries` (the functions the CLI
calls) --repeat times and print the median and the slowest, with the row
count it answered. Finally one run of the CLI itself, process start included.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg

from turnstile.stores import audit_queries as q
from turnstile.stores.db import Database
from turnstile.stores.engines import dispose_engines
from turnstile.stores.schema import upgrade

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
TOOLS = ["querySalesData", "createFollowUpTask", "checkEmailConfig", "createEmailTask",
         "getEmailTaskStatus", "retryEmailTask"]
ERRORS = ["the query took too long (over 3 s) and was stopped; tried 3 time(s)",
          "database unavailable; tried 3 time(s)", "database error (OperationalError)",
          "invalid arguments for querySalesData: startDate: bad date",
          "interrupted; effect unknown: its worker was lost mid-run",
          "The call to createEmailTask was rejected by bob: not now",
          "SMTP server refused the message"]
COLUMNS = ("execution_id", "workflow_id", "conversation_id", "user_id", "tool_name",
           "input_params", "start_time", "end_time", "status", "error_message")


def rows(n: int, days: int, now: datetime) -> Iterator[tuple[Any, ...]]:
    rnd = random.Random(17)
    span = days * 86400.0
    users = [f"user-{i:03d}" for i in range(200)]
    for i in range(n):
        t = now - timedelta(seconds=span * (n - i) / n)  # time order, like a real log
        heavy = rnd.random() < 0.05
        user = "user-heavy" if heavy else rnd.choice(users)
        tool = "querySalesData" if heavy else rnd.choice(TOOLS)
        failed = rnd.random() < 0.08
        status = "FAILED" if failed else "COMPLETED"
        error = rnd.choice(ERRORS) if failed else None
        stamp = q.stored_time(t)
        wf = f"turn-{i // 3}"
        yield (f"{wf}/call_{i % 3}", wf, f"c-{i // 12}", user, tool, '{"startDate": "x"}',
               stamp, stamp, status, error)


def load_sqlite(db: Database, n: int, days: int, now: datetime) -> None:
    with db.connect() as conn:
        it = rows(n, days, now)
        while True:
            batch = [dict(zip(COLUMNS, r, strict=True)) for _, r in zip(range(50_000), it,
                                                                        strict=False)]
            if not batch:
                break
            conn.executemany(q.log_table.insert(), batch)
        conn.execute("ANALYZE")


def load_postgres(db: Database, n: int, days: int, now: datetime) -> None:
    with psycopg.connect(db.url) as conn:
        with conn.cursor().copy(
                f"COPY tool_execution_log ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for r in rows(n, days, now):
                copy.write_row(r)
        conn.execute("ANALYZE tool_execution_log")


@contextmanager
def sqlite_database() -> Iterator[Database]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Database(f"sqlite:///{tmp}/audit.db")


@contextmanager
def postgres_database(url: str) -> Iterator[Database | None]:
    parsed = urlparse(url)
    name = f"turnstile_audit_bench_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError:
        yield None
        return
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        try:
            yield Database(urlunparse(parsed._replace(path=f"/{name}")))
        finally:
            dispose_engines()
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def timed(fn: Callable[[], list[dict[str, Any]]], repeat: int) -> tuple[float, float, int]:
    times, found = [], 0
    for _ in range(repeat):
        began = time.perf_counter()
        found = len(fn())
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), max(times), found


def questions(db: Database, now: datetime) -> list[tuple[str, Callable[[], Any]]]:
    hour, day, week = (q.AuditFilter(since=now - d) for d in
                       (timedelta(hours=1), timedelta(days=1), timedelta(days=7)))
    return [
        ("--top --over 100 --since 1h", lambda: q.top_callers(db, hour, over=100)),
        ("--top --over 100 --since 1h --tool querySalesData", lambda: q.top_callers(
            db, q.AuditFilter(since=hour.since, tool="querySalesData"), over=100)),
        ("--top --over 1000 --since 1d", lambda: q.top_callers(db, day, over=1000)),
        ("--top --over 10000 --since 7d", lambda: q.top_callers(db, week, over=10000)),
        ("--failures --since 1h", lambda: q.failures_by_category(db, hour)),
        ("--failures --since 1d", lambda: q.failures_by_category(db, day)),
        ("--failures --since 7d", lambda: q.failures_by_category(db, week)),
        ("--since 1h --user user-007", lambda: q.calls(
            db, q.AuditFilter(since=hour.since, user="user-007"))),
        ("--since 1d --tool retryEmailTask --status FAILED", lambda: q.calls(
            db, q.AuditFilter(since=day.since, tool="retryEmailTask", status="FAILED"))),
        ("(newest 50, no filter)", lambda: q.calls(db, q.AuditFilter())),
        ("--status FAILED (newest 50)", lambda: q.calls(db, q.AuditFilter(status="FAILED"))),
    ]


def bench(db: Database, n: int, days: int, repeat: int) -> None:
    now = datetime.now(UTC)
    upgrade(db)
    began = time.perf_counter()
    (load_postgres if db.dialect == "postgresql" else load_sqlite)(db, n, days, now)
    sys.stdout.write(f"\n{db.dialect}: loaded {n:,} audit rows over {days} days in "
                     f"{time.perf_counter() - began:.1f} s\n")
    sys.stdout.write(f"  {'question (starter.py audit ...)':<52} {'median ms':>10} "
                     f"{'max ms':>8} {'rows':>6}\n")
    for label, fn in questions(db, now):
        median, worst, found = timed(fn, repeat)
        sys.stdout.write(f"  {label:<52} {median:>10.1f} {worst:>8.1f} {found:>6}\n")
    env = {**os.environ, "DATABASE_URL": db.url}
    began = time.perf_counter()
    cli = subprocess.run([sys.executable, str(ROOT / "starter.py"), "audit", "--top",
                          "--over", "100", "--since", "1h"], env=env, capture_output=True,
                         text=True, check=True)
    sys.stdout.write(f"  CLI `starter.py audit --top --over 100 --since 1h`, whole process: "
                     f"{(time.perf_counter() - began) * 1000:.0f} ms; answered: "
                     f"{cli.stdout.splitlines()[2:3]}\n")
    dispose_engines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL",
                                                                 DEFAULT_PG))
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args(argv)
    if not args.skip_sqlite:
        with sqlite_database() as db:
            bench(db, args.rows, args.days, args.repeat)
    with postgres_database(args.postgres_url) as pg:
        if pg is None:
            sys.stdout.write(f"\npostgresql: not reachable at {args.postgres_url}; skipped\n")
        else:
            bench(pg, args.rows, args.days, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
