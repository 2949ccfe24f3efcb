"""What a turn costs as its conversation grows: 10 to 100,000 prior messages.

    .venv/bin/python -m bench.long_conversation                 # SQLite and PostgreSQL
    .venv/bin/python -m bench.long_conversation --sizes 10 1000 --turns 3 --backends sqlite

For each backend (PostgreSQL when reachable at 127.0.0.1:5432, in a database
of its own) and each size N: a conversation of N stored messages (user and
assistant text with a tool round every tenth exchange, as
tests/test_long_conversations.py writes them), one turn to catch up (the
first turn on messages written before the repair watermark existed reads
them once), then `--turns` measured turns through a dev server, an in-process
worker with the test service's defaults (window sized for an unnamed model:
8,192 tokens) and the strict fake model server, which answers at once. Per
size: turn latency p50 (start to result), rows the database returned per
turn (turnstile.stores.connection.rows_read, all of the worker's statements), bytes
of the model request, bytes of the turn's history. Goal: 100,000
within 1.2x of 10 on every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from bench.bench_support import DevServer, connect
from tests.support.services import make_service
from tests.support.turns import running_worker
from tests.test_long_conversations import _history
from turnstile.engine.contract import TurnStatus
from turnstile.stores.connection import rows_read
from turnstile.stores.db import Database
from turnstile.stores.schema import ensure_schema
from turnstile.testing import FakeOpenAIServer, text_reply


async def measure(client_address: str, url: str, sizes: list[int], turns: int,
                  fake: FakeOpenAIServer) -> list[tuple[int, float, float, int, int]]:
    client = await connect(client_address)
    fake.default = lambda _req: text_reply("still here")
    out = []
    queue = f"long-{uuid.uuid4().hex[:6]}"
    async with running_worker(client, queue, url, [make_service()], llm_url=fake.url) as t:
        for n in sizes:
            conv = f"long-{n}-{uuid.uuid4().hex[:6]}"
            t.rt.memory.check_owner(conv, "alice")
            stored = _history(n)
            for start in range(0, n, 5000):  # one transaction per 5,000 rows
                t.rt.memory.append(conv, start, stored[start:start + 5000], "seed")
            await t.run("catch up", conversation=conv)
            latencies, rows, request, history = [], [], [], []
            for i in range(turns):
                fake.requests.clear()
                before = rows_read.total
                began = time.perf_counter()
                handle = await t.start(f"and now? ({i})", conversation=conv)
                result = await handle.result()
                latencies.append((time.perf_counter() - began) * 1000)
                rows.append(rows_read.total - before)
                if result.status != TurnStatus.COMPLETED:
                    raise RuntimeError(f"turn ended {result.status}: {result.error}")
                request.append(fake.requests[-1]["_bytes"])
                events = (await handle.fetch_history()).events
                history.append(sum(e.ByteSize() for e in events))
            out.append((n, statistics.median(latencies), statistics.median(rows),
                        int(statistics.median(request)), int(statistics.median(history))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 10_000, 100_000])
    parser.add_argument("--turns", type=int, default=5, help="measured turns per size")
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    args = parser.parse_args()
    from tests.support.databases import postgres_reachable, temporary_postgres_database

    with tempfile.TemporaryDirectory(prefix="turnstile-long-") as tmp, ExitStack() as stack:
        server = DevServer(Path(tmp) / "temporal.log")
        stack.callback(server.stop)
        fake = FakeOpenAIServer()
        stack.callback(fake.close)
        for backend in args.backends:
            if backend == "postgresql":
                if not postgres_reachable():
                    print("postgresql: not reachable at 127.0.0.1:5432, skipped")
                    continue
                url = stack.enter_context(temporary_postgres_database())
            else:
                url = f"sqlite:///{Path(tmp) / 'long.db'}"
            ensure_schema(Database(url))
            figures = asyncio.run(measure(server.address, url, args.sizes, args.turns, fake))
            print(f"{backend}: {args.turns} turns per size, medians")
            print(f"  {'messages':>9} {'p50 ms':>8} {'rows/turn':>10} {'request B':>10} "
                  f"{'history B':>10}")
            for n, p50, rows, request, history in figures:
                print(f"  {n:>9,} {p50:>8.0f} {rows:>10,.0f} {request:>10,} {history:>10,}")
            # 10 messages do not fill the window; from the first size that does,
            # the figures should stay flat.
            for base in (figures[0], *figures[1:2]):
                last = figures[-1]
                if last is base:
                    continue
                print(f"  {last[0]:,} / {base[0]:,}: p50 {last[1] / base[1]:.2f}x, rows "
                      f"{last[2] / max(base[2], 1):.2f}x, request {last[3] / base[3]:.2f}x, "
                      f"history {last[4] / base[4]:.2f}x")

if __name__ == "__main__":
    main()
