"""Sales reference app benchmark: query latency and e-mail sender throughput.

    .venv/bin/python -m bench.sales                # 1,000,000 rows (slow to seed)
    .venv/bin/python -m bench.sales --rows 20000

For SQLite (a temporary file) and, when it answers, PostgreSQL (database
`turnstile_bench`, created if missing on the server of --postgres-url):
queue --mails e-mails and time the sender delivering them to the local SMTP
server (mails/s); then seed N rows and time `querySalesData` for random
one-week ranges, the way the tool runs it (a read-only connection from the
pool per call, the query, the result model), and report p50/p95.

Each figure is printed next to v0.1.0's, measured with v0.1.0's own
bench/sales.py on 1,000,000 rows on this machine kind (2 cores), and next to
the target.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg

from turnstile.runtime.config import Settings
from turnstile.sales import outbox
from turnstile.sales.query import run_sales_query
from turnstile.sales.schema import TABLES
from turnstile.sales.seed import PERIOD_DAYS, seed
from turnstile.sales.sender import SenderConfig, deliver_due
from turnstile.sales.smtp_server import LocalSmtpServer
from turnstile.stores.db import Database
from turnstile.stores.schema import upgrade

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/turnstile_bench"

# v0.1.0 (git tag), `python -m bench.sales` at that tag, 1,000,000 rows, 2 cores:
# (query p50 ms, query p95 ms, sender mails/s). Recorded, not measured by this run.
V0_1 = {"sqlite": (103.0, 106.0, 162.0), "postgresql": (42.5, 56.9, 61.0)}
TARGET_P95_MS, TARGET_MAILS_S = 20.0, 300.0


def postgres_database(url: str) -> Database | None:
    """The benchmark database, created if missing; None if the server is down."""
    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = urlunparse(parsed._replace(path="/postgres"))
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        print(f"PostgreSQL at {parsed.hostname}:{parsed.port}: not reachable ({exc}); skipped")
        return None
    return Database(url)


def percentile(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def bench_queries(db: Database, today: date, queries: int) -> tuple[float, float, int]:
    rng = random.Random(7)
    latencies = []
    matched = 0
    for _ in range(queries):
        start = today - timedelta(days=rng.randint(7, PERIOD_DAYS))
        began = time.perf_counter()
        with db.connect(readonly=True) as conn:
            result = run_sales_query(
                conn, start, start + timedelta(days=6), Decimal(50_000), today=today
            )
        latencies.append((time.perf_counter() - began) * 1000)
        matched += result.totalCount
    return percentile(latencies, 50), percentile(latencies, 95), matched // queries


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def smtp_server(directory: Path, port: int, mode: str) -> Iterator[None]:
    """The local SMTP server (turnstile.sales.smtp_server): in this process, in
    a thread (v0.1.0's bench did so), or as its own process, as `make up` and
    docker-compose run it."""
    if mode == "thread":
        with LocalSmtpServer(directory, port=port):
            yield
        return
    proc = subprocess.Popen([sys.executable, "-m", "turnstile.sales.smtp_server", "--port",
                             str(port), "--dir", str(directory)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the SMTP server process did not start") from None
                time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def bench_sender(db: Database, mails: int, workdir: Path, smtp: str = "thread") -> float:
    port = free_port()
    settings = Settings(smtp_host="127.0.0.1", smtp_port=port)
    run = datetime.now(UTC).strftime("%H%M%S%f")
    for i in range(mails):
        outbox.enqueue(db, idempotency_key=f"bench-{run}/{i}", recipient=f"ops{i}@example.com",
                       subject=f"Bench {i}", body="Customers above threshold: ...")
    config = SenderConfig(batch_size=100)
    with smtp_server(workdir / f"mail-{db.dialect}-{run}", port, smtp):
        began = time.perf_counter()
        sent = 0
        while sent < mails:
            delivered = deliver_due(db, settings, config)
            if delivered == 0:
                raise RuntimeError(f"sender stalled after {sent} of {mails} mails")
            sent += delivered
        elapsed = time.perf_counter() - began
    return mails / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--mails", type=int, default=1000)
    parser.add_argument("--postgres-url", default=DEFAULT_PG)
    parser.add_argument("--smtp", choices=["thread", "process"], default="thread",
                        help="the SMTP server in a thread of the bench (v0.1.0's way, the "
                             "default) or as its own process")
    args = parser.parse_args(argv)
    today = datetime.now(UTC).date()
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-") as tmp:
        workdir = Path(tmp)
        backends = [Database(f"sqlite:///{workdir / 'bench.db'}")]
        pg = postgres_database(args.postgres_url)
        if pg is not None:
            backends.append(pg)
        print(f"rows={args.rows:,} queries={args.queries} mails={args.mails} "
              f"smtp server: {args.smtp}; load average {os.getloadavg()[0]:.2f}")
        print(f"{'':<10} {'':>8} | {'one-week query p50 / p95 (ms)':^36} | "
              f"{'sender (mails/s)':^26}")
        print(f"{'database':<10} {'seed s':>8} | {'v0.1.0':>11} {'now':>11} {'target':>10} | "
              f"{'v0.1.0':>7} {'now':>7} {'target':>8}")
        for db in backends:
            # The sender first: right after a bulk load of a million rows the
            # server is still writing them out (checkpoint, autovacuum), which
            # is not the state a sender runs in.
            upgrade(db, tables=TABLES)  # the app's tables: their privileges
            rate = bench_sender(db, args.mails, workdir, args.smtp)
            began = time.perf_counter()
            seed(db, rows=args.rows, today=today)
            seeded = time.perf_counter() - began
            p50, p95, matched = bench_queries(db, today, args.queries)
            old = V0_1[db.dialect]
            print(f"{db.dialect:<10} {seeded:8.1f} | {old[0]:5.1f}/{old[1]:5.1f} "
                  f"{p50:5.1f}/{p95:5.1f} {'p95<=' + format(TARGET_P95_MS, 'g'):>10} | "
                  f"{old[2]:7.0f} {rate:7.0f} {'>=' + format(TARGET_MAILS_S, 'g'):>8}"
                  f"   (~{matched} customers > 50,000 per week)")

if __name__ == "__main__":
    main()
