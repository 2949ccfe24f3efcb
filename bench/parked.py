"""Thousands of turns parked on approvals, on one worker.

    .venv/bin/python -m bench.parked                          # 2,000 parked turns
    .venv/bin/python -m bench.parked --turns 500 --cache 100  # a smaller cache

A dev server (in memory, speed flags), a seeded SQLite database, the strict
fake model server and one worker process (`python worker.py --no-sender`,
`TURNSTILE_MAX_CACHED_WORKFLOWS=--cache`). `--turns` turns of the sales
service each ask for `createEmailTask` (which needs a reviewer's approval)
and park. Then:

1. worker RSS with every turn parked;
2. `--sample` turns approved one at a time, at random, while the others stay
   parked: time from the approval signal to the model being asked again
   (the fake model notes when each turn's second request arrives);
3. the worker is stopped (SIGTERM) and started again; RSS after restart, and
   the same approvals timed again (turns now evicted: resumed by replay);
4. every other turn approved (20 signals in flight), all awaited: statuses
   and `email_task` rows (one per approved call; the sender is off);
   `--no-rest` stops after step 3.

After steps 2 and 3, where the resume time went, from the sampled turns'
histories (bench/resume_phases.py: dispatch of the workflow task, the
worker's task, the activities' dispatch, the tool).

Goals: p95 resume <= 1 s with 2,000 parked; RSS bounded by the
cache, not by the number of parked turns; nothing lost across the restart.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.bench_support import DevServer, WorkerProc, connect, free_port, percentile
from bench.resume_phases import resume_phases
from tests.support.sql import fetchone
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    TurnInput,
    TurnResult,
)
from turnstile.sales.seed import seed
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

ROOT = Path(__file__).resolve().parents[1]
MAIL = {"to": "ops@example.com", "subject": "Follow up", "body": "C0001"}


class Model:
    """Asks for the e-mail once per turn; answers once the result is in. Notes
    when each turn's model is asked after its tool ran (the resume)."""

    def __init__(self) -> None:
        self.resumed: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> Any:
        messages = request.get("messages") or []
        user = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
        found = re.search(r"parked-[0-9]+-[0-9a-f]{6}", str(user))
        tag = found.group(0) if found else "?"
        if any(m.get("role") == "tool" for m in messages):
            with self.lock:
                self.resumed.setdefault(tag, time.perf_counter())
            return text_reply("queued")
        return tool_reply((f"e-{tag}", "createEmailTask", MAIL))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker_pid(proc: WorkerProc) -> int:
    return proc.proc.pid


async def park(client: Any, queue: str, n: int) -> list[str]:
    gate = asyncio.Semaphore(50)
    ids = [f"parked-{i}-{uuid.uuid4().hex[:6]}" for i in range(n)]

    async def one(wf_id: str) -> None:
        async with gate:
            await client.start_workflow(
                WORKFLOW_TYPE, TurnInput(conversation_id=wf_id, user_id="alice",
                                         message=f"mail ops {wf_id}", service="sales-assistant"),
                id=wf_id, task_queue=queue)

    await asyncio.gather(*(one(i) for i in ids))
    deadline = time.monotonic() + 60 + n * 0.5
    while True:
        parked = (await client.count_workflows(
            f"TaskQueue = '{queue}' AND TurnstilePendingApprovals > 0")).count
        if parked >= n:
            return ids
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {parked} of {n} turns parked")
        await asyncio.sleep(1)


async def approve(client: Any, wf_id: str) -> None:
    await client.get_workflow_handle(wf_id).signal("approve", ApproveSignal(
        tool_call_id=call_id(wf_id), reviewer="bench-reviewer"))


def call_id(wf_id: str) -> str:
    """The id `Model` gave the turn's e-mail call (a query per turn would
    replay every evicted turn just to read it)."""
    return f"e-{wf_id}"


async def timed_resumes(client: Any, model: Model, ids: list[str]) -> list[float]:
    out = []
    for wf_id in ids:
        tool_call = call_id(wf_id)
        began = time.perf_counter()
        await client.get_workflow_handle(wf_id).signal("approve", ApproveSignal(
            tool_call_id=tool_call, reviewer="bench-reviewer"))
        while wf_id not in model.resumed:
            if time.perf_counter() - began > 60:
                raise RuntimeError(f"{wf_id} did not resume within 60 s")
            await asyncio.sleep(0.002)
        out.append((model.resumed[wf_id] - began) * 1000)
    return out


def cache_figures(port: int) -> str:
    """The SDK's sticky-cache series from the worker's Prometheus endpoint."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for row in text.splitlines():
        if row.startswith("temporal_sticky_cache") and " " in row:
            name = row.split("{", 1)[0].split(" ", 1)[0]
            found[name] = found.get(name, 0.0) + float(row.rsplit(" ", 1)[1])
    return ", ".join(f"{k} {v:,.0f}" for k, v in sorted(found.items())) or "no series"


def line(label: str, ms: list[float]) -> str:
    return (f"{label}: p50 {statistics.median(ms):.0f} ms, p95 {percentile(ms, 0.95):.0f} ms, "
            f"max {max(ms):.0f} ms ({len(ms)} approvals)")


async def run(args: argparse.Namespace, workdir: Path) -> None:
    db_url = f"sqlite:///{workdir / 'parked.db'}"
    seed(Database(db_url), rows=200)
    server = DevServer(workdir / "temporal.log")
    model = Model()
    fake = FakeOpenAIServer(keep_alive=True)
    fake.default = model
    queue = f"parked-{uuid.uuid4().hex[:6]}"
    metrics_port = free_port()
    env = {"TURNSTILE_METRICS_PORT": str(metrics_port),
           "TEMPORAL_ADDRESS": server.address, "DATABASE_URL": db_url,
           "LLM_BASE_URL": fake.url, "TURNSTILE_DATA_DIR": str(workdir),
           "TURNSTILE_TASK_QUEUE": queue, "TURNSTILE_MAX_CACHED_WORKFLOWS": str(args.cache),
           "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "worker.py", "--no-sender"]
    ready = "worker serving task queue"
    worker = None
    try:
        client = await connect(server.address)
        worker = WorkerProc(command, env, workdir / "worker-1.log", ready, cwd=ROOT)
        print(f"{args.turns} turns, workflow cache {args.cache}, SQLite")
        began = time.perf_counter()
        ids = await park(client, queue, args.turns)
        print(f"parked {len(ids)} turns in {time.perf_counter() - began:.1f} s; "
              f"worker RSS {rss_mib(worker_pid(worker)):.0f} MiB")
        rng = random.Random(29)
        order = rng.sample(ids, len(ids))
        first, second, rest = (order[:args.sample], order[args.sample:2 * args.sample],
                               order[2 * args.sample:])
        print(line("resume, turns parked in the running worker", await timed_resumes(
            client, model, first)))
        print(await resume_phases(client, first))
        worker.stop()
        worker = WorkerProc(command, env, workdir / "worker-2.log", ready, cwd=ROOT)
        await asyncio.sleep(2)
        print(f"worker restarted; RSS {rss_mib(worker_pid(worker)):.0f} MiB")
        print(line("resume after the restart (replayed)", await timed_resumes(
            client, model, second)))
        print(await resume_phases(client, second))
        if not args.rest:
            return
        print(f"after the sampled approvals: worker RSS {rss_mib(worker_pid(worker)):.0f} MiB")
        began = time.perf_counter()
        gate = asyncio.Semaphore(20)  # approvals in flight

        async def approve_one(wf_id: str) -> None:
            async with gate:
                await approve(client, wf_id)

        await asyncio.gather(*(approve_one(i) for i in rest))
        # Waited for in bounded numbers: each result() is a long poll, and the
        # dev server limits concurrent polls per namespace.
        results = []
        for start in range(0, len(ids), 50):
            results += await asyncio.gather(*(client.get_workflow_handle(
                i, result_type=TurnResult).result() for i in ids[start:start + 50]))
        took = time.perf_counter() - began
        statuses: dict[str, int] = {}
        for r in results:
            statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
        with Database(db_url).connect() as conn:
            mails = fetchone(conn, "SELECT COUNT(*) AS n FROM email_task")
        print(f"approved the other {len(rest)} in {took:.1f} s; statuses {statuses}; "
              f"email_task rows {mails['n'] if mails else 0}; worker RSS "
              f"{rss_mib(worker_pid(worker)):.0f} MiB")
        print("worker's workflow cache (the SDK's series, this worker process since its "
              f"restart): {cache_figures(metrics_port)}")
    finally:
        if worker is not None:
            worker.stop()
        fake.close()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--cache", type=int, default=1000, help="TURNSTILE_MAX_CACHED_WORKFLOWS")
    parser.add_argument("--sample", type=int, default=30, help="approvals timed, per phase")
    parser.add_argument("--no-rest", dest="rest", action="store_false",
                        help="stop after the timed approvals (the others are not approved)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="turnstile-parked-") as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
