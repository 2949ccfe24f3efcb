"""Turn latency and throughput on a tuned Temporal dev server, next to a floor.

    .venv/bin/python -m bench.turns [--turns 50] [--concurrency 1 20] [--tool-rounds 2]

Starts `temporal server start-dev` (in memory, with the speed flags of
turnstile.runtime.devstack) as a subprocess in its own process group, an instant
scripted OpenAI-compatible model (tests.support.fake_llm.FakeLLM) and, in this
process, a Turnstile worker (worker.build_worker) serving the test service
(tests.support.services.make_service, tool `add`) on a SQLite file in a temp
directory. Each turn: the model asks for `add` --tool-rounds times, then
answers (2 rounds = 3 model calls + 2 tool calls).

The floor: `FloorTurn`, defined here, runs as many no-op activities per turn
as an AgentTurn scheduled (counted from its history), one after the other, no
database, no HTTP, in the same process and against the same server.

Reported per scenario and concurrency: p50/p95 turn latency (start to result,
seen by the client), turns/s, activities, history events and history bytes
(sum of event ByteSize()) per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from turnstile.stores.schema import ensure_schema

with workflow.unsafe.imports_passed_through():
    from activities import Runtime
    from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
    from tests.support.services import make_service
    from turnstile.engine.contract import WORKFLOW_TYPE, TurnInput, TurnResult, TurnStatus
    from turnstile.providers import build_provider
    from turnstile.runtime.config import Settings
    from turnstile.runtime.devstack import TEMPORAL_SPEED_FLAGS, temporal_dev_command
    from turnstile.runtime.search_attributes import ensure_search_attributes
    from turnstile.runtime.services import ServiceRegistry
    from worker import build_worker

log = logging.getLogger("bench.turns")


# --- the floor: the same number of activities, doing nothing ---------------------

@activity.defn(name="bench.noop")
async def noop(step: int) -> int:
    return step


@workflow.defn(name="FloorTurn")
class FloorTurn:
    @workflow.run
    async def run(self, activities: int) -> int:
        for step in range(activities):
            await workflow.execute_activity(noop, step,
                                            start_to_close_timeout=timedelta(seconds=30))
        return activities


# --- the scripted model ----------------------------------------------------------

def scripted_model(tool_rounds: int):  # type: ignore[no-untyped-def]
    """Per request: ask for `add` until the turn has `tool_rounds` tool results."""

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        messages = request.get("messages") or []
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"),
                        default=-1)
        done = sum(1 for m in messages[last_user + 1:] if m.get("role") == "tool")
        if done < tool_rounds:
            call_id = f"call-{uuid.uuid4().hex[:12]}"
            return tool_reply((call_id, "add", {"a": done + 1, "b": 1}))
        return text_reply(f"done after {done} tool call(s)")

    return reply


# --- the dev server --------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DevServer:
    """`temporal server start-dev` in its own process group."""

    def __init__(self, logfile: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        cmd = temporal_dev_command(self.port, 0, None, headless=True)
        with open(logfile, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        log.info("dev server pid %s on %s: %s", self.proc.pid, self.address, " ".join(cmd))

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


async def connect(address: str, timeout: float = 60) -> Client:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client = await Client.connect(address, data_converter=pydantic_data_converter)
            await client.count_workflows()
            return client
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


# --- measuring -------------------------------------------------------------------

@dataclass
class Row:
    scenario: str
    concurrency: int
    turns: int
    p50_ms: float
    p95_ms: float
    turns_per_s: float
    activities: float
    events: float
    history_bytes: float


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def run_batch(client: Client, start_one, turns: int,  # type: ignore[no-untyped-def]
                    concurrency: int) -> tuple[list[float], float, list[str], list[Any]]:
    """Run `turns` turns, at most `concurrency` at a time. Returns latencies (s),
    wall time (s), workflow ids and results."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    ids: list[str] = []
    results: list[Any] = []

    async def one(i: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            handle = await start_one(i)
            result = await handle.result()
            latencies.append(time.perf_counter() - t0)
            ids.append(handle.id)
            results.append(result)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(turns)))
    return latencies, time.perf_counter() - t0, ids, results


async def history_stats(client: Client, ids: list[str]) -> tuple[float, float, float]:
    """Mean activities, events and bytes per workflow history."""
    acts = events = size = 0
    for wf_id in ids:
        history = await client.get_workflow_handle(wf_id).fetch_history()
        events += len(history.events)
        size += sum(e.ByteSize() for e in history.events)
        acts += sum(1 for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    n = len(ids)
    return acts / n, events / n, size / n


async def activity_types(client: Client, wf_id: str) -> dict[str, int]:
    history = await client.get_workflow_handle(wf_id).fetch_history()
    counts: dict[str, int] = {}
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            counts[name] = counts.get(name, 0) + 1
    return counts


async def measure(client: Client, scenario: str, start_one, turns: int,  # type: ignore[no-untyped-def]
                  concurrency: int, check) -> Row:
    latencies, wall, ids, results = await run_batch(client, start_one, turns, concurrency)
    for result in results:
        check(result)
    acts, events, size = await history_stats(client, ids)
    row = Row(scenario, concurrency, turns, 1000 * percentile(latencies, 0.50),
              1000 * percentile(latencies, 0.95), turns / wall, acts, events, size)
    log.info("%s", row)
    return row


def print_table(rows: list[Row], header: str) -> None:
    print(header)
    cols = ("scenario", "conc", "turns", "p50 ms", "p95 ms", "turns/s", "activities/turn",
            "events/turn", "bytes/turn")
    fmt = "{:<34} {:>4} {:>5} {:>7} {:>7} {:>8} {:>15} {:>11} {:>10}"
    print(fmt.format(*cols))
    print("-" * 109)
    for r in rows:
        print(fmt.format(r.scenario, r.concurrency, r.turns, f"{r.p50_ms:.1f}",
                         f"{r.p95_ms:.1f}", f"{r.turns_per_s:.1f}", f"{r.activities:.1f}",
                         f"{r.events:.1f}", f"{r.history_bytes:,.0f}"))


# --- main ------------------------------------------------------------------------

async def bench(args: argparse.Namespace, workdir: Path) -> list[Row]:
    server = DevServer(workdir / "temporal.log")
    fake = FakeLLM()
    fake.default = scripted_model(args.tool_rounds)
    try:
        client = await connect(server.address)
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        settings = Settings.from_env({
            "TURNSTILE_TASK_QUEUE": queue,
            "DATABASE_URL": args.database_url or f"sqlite:///{workdir / 'turnstile.db'}",
            "LLM_BASE_URL": fake.url,
            "TURNSTILE_DATA_DIR": str(workdir),
        })
        rt = Runtime.build(settings, ServiceRegistry([make_service()]), build_provider(settings))
        ensure_schema(rt.db)
        rt.search_attributes = await ensure_search_attributes(client, "default")
        floor_queue = f"{queue}-floor"
        rows: list[Row] = []
        run_id = uuid.uuid4().hex[:6]

        async def start_turn(i: int):  # type: ignore[no-untyped-def]
            turn = TurnInput(conversation_id=f"bench-{run_id}-{uuid.uuid4().hex[:8]}",
                             user_id="bench", message=f"what is {i} + 1?", service="test",
                             variables={"team": "bench"})
            return await client.start_workflow(
                WORKFLOW_TYPE, turn, id=f"turn-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=TurnResult)

        def check_turn(result: TurnResult) -> None:
            if result.status != TurnStatus.COMPLETED or len(result.tool_calls) != args.tool_rounds:
                raise RuntimeError(f"unexpected turn result: {result.model_dump_json()[:500]}")

        floor_activities = 0

        async def start_floor(i: int):  # type: ignore[no-untyped-def]
            return await client.start_workflow(
                FloorTurn.run, floor_activities, id=f"floor-{uuid.uuid4().hex[:12]}",
                task_queue=floor_queue)

        def check_floor(result: int) -> None:
            if result != floor_activities:
                raise RuntimeError(f"floor turn ran {result} activities")

        floor_worker = Worker(client, task_queue=floor_queue, workflows=[FloorTurn],
                              activities=[noop], max_concurrent_activities=32)
        async with build_worker(client, rt), floor_worker:
            # Warm-up (not measured): sandbox imports, SQLite file, connections.
            _, _, warm_ids, _ = await run_batch(client, start_turn, args.warmup, 1)
            acts, _, _ = await history_stats(client, warm_ids)
            floor_activities = round(acts)
            log.info("activities of one turn: %s", await activity_types(client, warm_ids[0]))
            await run_batch(client, start_floor, args.warmup, 1)
            label = f"AgentTurn ({args.tool_rounds + 1} model + {args.tool_rounds} tool)"
            for conc in args.concurrency:
                rows.append(await measure(client, label, start_turn, args.turns, conc,
                                          check_turn))
            for conc in args.concurrency:
                rows.append(await measure(client, f"floor ({floor_activities} no-op activities)",
                                          start_floor, args.turns, conc, check_floor))
        await rt.provider.aclose()
        model_calls = len(fake.requests)
        log.info("fake model answered %d requests", model_calls)
        return rows
    finally:
        fake.close()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=50, help="turns per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--tool-rounds", type=int, default=2,
                        help="tool calls per turn (model calls = this + 1)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured turns first")
    parser.add_argument("--database-url", default=None,
                        help="Turnstile's database (default: SQLite in a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-") as tmp:
        rows = asyncio.run(bench(args, Path(tmp)))
    header = (f"{args.turns} turns per row, tool rounds {args.tool_rounds}, "
              f"dev server in memory + {' '.join(TEMPORAL_SPEED_FLAGS)}; "
              f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
              f"load avg {load0:.2f} -> {os.getloadavg()[0]:.2f}; "
              f"total {time.monotonic() - t0:.0f} s")
    print_table(rows, header)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
