"""One turn, three ways, one run: Turnstile, a minimal hand-written turn and
pydantic-ai's TemporalAgent, side by side on the same dev server.

    make bench-install        # once: the bench extra (pydantic-ai-slim, py-spy)
    .venv/bin/python -m bench.turns [--turns 50] [--concurrency 1 20 50] [--profile 100]

Starts `temporal server start-dev` (in memory, with the speed flags of
turnstile.runtime.devstack), an instant scripted OpenAI-compatible model
(turnstile.testing.FakeOpenAIServer, a real HTTP server in this process) and a
SQLite database seeded like `starter.py seed` (100,000 rows). Each system's
worker is its own process, started and stopped here, so its CPU time is its
own (/proc/PID/stat). All three are up at once; per concurrency, `--rounds`
interleaved rounds of one batch per system (the order rotates), so drifting
load on a shared machine falls on all three alike:

- **turnstile**: `python worker.py --no-sender`, the product with its
  defaults, serving the reference service `sales-assistant` (audit, memory,
  retrieval, lock: everything a default turn does);
- **minimal**: bench/minimal_turn.py, a workflow of exactly the model and
  tool activities (`python -m bench.turn_workers minimal`);
- **pydantic-ai**: bench/peer_turn.py, `TemporalAgent` (`... peer`).

The same turn for all: the scripted model asks for `querySalesData` (last
week, then the week before, minAmount 50,000), then answers: 3 model calls
and 2 `querySalesData` queries on the same database. Every result is checked.

Per system and concurrency: p50/p95 latency (start to result, as the client
sees it), turns/s (turns / wall time of the batches; each batch at least 2x
concurrency turns), activities, history events and bytes (sum of each event's ByteSize())
per turn, CPU seconds per turn of the worker, of the dev server and of this
process (the client and the scripted model: it answers every system's
requests, so bigger requests cost it more); then the ratios.
`--profile N`: N more Turnstile turns at concurrency 20 with its worker under
py-spy; prints where a turn's worker CPU goes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from bench.bench_support import (
    DevServer,
    WorkerProc,
    activity_types,
    bench_stack,
    history_stats,
    percentile,
)
from bench.profile_summary import summarize
from turnstile.engine.contract import WORKFLOW_TYPE, TurnInput, TurnResult, TurnStatus
from turnstile.runtime.devstack import TEMPORAL_SPEED_FLAGS
from turnstile.sales.seed import last_week
from turnstile.testing import text_reply, tool_reply

log = logging.getLogger("bench.turns")
ROOT = Path(__file__).resolve().parents[1]
MESSAGE = "Which customers' sales exceeded 50,000 last week, and the week before?"
ANSWER = "done after 2 queries"
QUERIES = 2


def complete(body: dict[str, Any]) -> dict[str, Any]:
    """Every field OpenAI sends (pydantic-ai validates them with the openai SDK's types)."""
    usage = body["usage"]
    return {**body, "object": "chat.completion", "created": 1_764_547_200,
            "usage": {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}}


def scripted_model(queries: int = QUERIES,
                   answer: str = ANSWER) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Per request: one `querySalesData` per week until the turn has `queries` results."""
    start, end = last_week(datetime.now(UTC).date())

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        messages = request.get("messages") or []
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"),
                        default=-1)
        done = sum(1 for m in messages[last_user + 1:] if m.get("role") == "tool")
        if done < queries:
            week = timedelta(days=7 * done)
            return complete(tool_reply((f"call-{uuid.uuid4().hex[:12]}", "querySalesData", {
                "startDate": (start - week).isoformat(), "endDate": (end - week).isoformat(),
                "minAmount": 50000})))
        return complete(text_reply(answer))

    return reply


@dataclass
class System:
    name: str
    command: list[str]
    ready: str
    start: Callable[[Client, str, int], Awaitable[WorkflowHandle[Any, Any]]]
    check: Callable[[Any], None]
    env: dict[str, str] | None = None  # added to the worker's environment


async def _start_turnstile(client: Client, queue: str, i: int) -> WorkflowHandle[Any, Any]:
    turn = TurnInput(conversation_id=f"bench-{uuid.uuid4().hex[:12]}", user_id="bench",
                     message=MESSAGE, service="sales-assistant")
    return await client.start_workflow(WORKFLOW_TYPE, turn, id=f"turn-{uuid.uuid4().hex[:12]}",
                                       task_queue=queue, result_type=TurnResult)


def _check_turnstile(result: TurnResult) -> None:
    if (result.status != TurnStatus.COMPLETED or result.answer != ANSWER
            or [c.name for c in result.tool_calls] != ["querySalesData"] * QUERIES):
        raise RuntimeError(f"unexpected turn result: {result.model_dump_json()[:500]}")


def _by_name(workflow: str) -> Callable[[Client, str, int], Awaitable[WorkflowHandle[Any, Any]]]:
    async def start(client: Client, queue: str, i: int) -> WorkflowHandle[Any, Any]:
        return await client.start_workflow(workflow, MESSAGE, id=f"{workflow}-{uuid.uuid4().hex}",
                                           task_queue=queue, result_type=str)
    return start


def _check_answer(result: str) -> None:
    if result != ANSWER:
        raise RuntimeError(f"unexpected answer: {result[:300]!r}")


SYSTEMS = {
    "turnstile": System("turnstile", [sys.executable, "worker.py", "--no-sender"],
                        "worker serving task queue", _start_turnstile, _check_turnstile),
    "minimal": System("minimal", [sys.executable, "-m", "bench.turn_workers", "minimal"],
                      "bench worker ready", _by_name("MinimalTurn"), _check_answer),
    "pydantic-ai": System("pydantic-ai", [sys.executable, "-m", "bench.turn_workers", "peer"],
                          "bench worker ready", _by_name("PeerTurn"), _check_answer),
}


@dataclass
class Row:
    system: str
    concurrency: int
    turns: int
    p50_ms: float
    p95_ms: float
    turns_per_s: float
    activities: float
    events: float
    history_bytes: float
    cpu_s_per_turn: float
    server_cpu_s_per_turn: float = 0.0  # the Temporal dev server
    bench_cpu_s_per_turn: float = 0.0  # this process: the client and the scripted model


async def run_batch(client: Client, system: System, queue: str, turns: int,
                    concurrency: int) -> tuple[list[float], float, list[str]]:
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    ids: list[str] = []

    async def one(i: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            handle = await system.start(client, queue, i)
            result = await handle.result()
            latencies.append(time.perf_counter() - t0)
            system.check(result)
            ids.append(handle.id)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(turns)))
    return latencies, time.perf_counter() - t0, ids


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


async def measure_all(client: Client, server: DevServer, systems: list[System],
                      env: dict[str, str], workdir: Path,
                      args: argparse.Namespace) -> list[Row]:
    """All workers up at once; per concurrency, `--rounds` rounds of one batch
    per system, the order rotating each round, so drifting load on a shared
    machine falls on every system alike."""
    workers: dict[str, tuple[WorkerProc, str]] = {}
    try:
        for system in systems:
            workers[system.name] = start_worker(system, env, workdir)
        for system in systems:  # warm-up: imports, pools, caches (not measured)
            _, _, warm = await run_batch(client, system, workers[system.name][1], args.warmup, 1)
            kinds = await activity_types(client, warm[0])
            args.activity_lines.append(f"{system.name}: " + ", ".join(
                f"{name} x{n}" for name, n in kinds.items()))
        rows = []
        for conc in args.concurrency:
            turns = max(args.turns, 2 * conc)
            # Per system: latencies, wall time, workflow ids, and CPU seconds of
            # its worker, of the server and of this process (client + model),
            # each over that system's batches only (one batch runs at a time).
            got: dict[str, tuple[list[float], float, list[str], list[float]]] = {
                s.name: ([], 0.0, [], [0.0, 0.0, 0.0]) for s in systems}
            for r in range(args.rounds):
                for system in systems[r % len(systems):] + systems[:r % len(systems)]:
                    worker, queue = workers[system.name]
                    cpu0 = (worker.cpu_seconds(), server.cpu_seconds(), _own_cpu_seconds())
                    latencies, wall, ids = await run_batch(client, system, queue, turns, conc)
                    cpu1 = (worker.cpu_seconds(), server.cpu_seconds(), _own_cpu_seconds())
                    lat, walls, all_ids, cpu = got[system.name]
                    spent = [c + b - a for c, a, b in zip(cpu, cpu0, cpu1, strict=True)]
                    got[system.name] = (lat + latencies, walls + wall, all_ids + ids, spent)
            for system in systems:
                lat, walls, ids, cpu = got[system.name]
                acts, events, size = await history_stats(client, ids[:turns])
                n = len(ids)
                row = Row(system.name, conc, n, 1000 * percentile(lat, 0.5),
                          1000 * percentile(lat, 0.95), n / walls, acts, events, size,
                          cpu[0] / n, cpu[1] / n, cpu[2] / n)
                log.info("%s", row)
                rows.append(row)
        return rows
    finally:
        for worker, _ in workers.values():
            worker.stop()


async def profile_worker(client: Client, env: dict[str, str], workdir: Path,
                         turns: int, keep: Path | None, name: str = "turnstile") -> str:
    """py-spy attached to a warm worker of system `name` for `turns` turns at concurrency 20."""
    queue = f"bench-profile-{uuid.uuid4().hex[:6]}"
    raw = workdir / f"{name}-worker.pyspy.txt"
    system = SYSTEMS[name]
    worker = WorkerProc(system.command, {**env, "TURNSTILE_TASK_QUEUE": queue},
                        workdir / "worker-profile.log", system.ready, cwd=ROOT)
    try:
        await run_batch(client, system, queue, 3, 1)
        spy = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--gil", "-r", "200",
             "-f", "raw", "-o", str(raw), "--pid", str(worker.proc.pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1)  # attached
        await run_batch(client, system, queue, turns, 20)
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        spy.wait(timeout=60)
    finally:
        worker.stop()
    if keep:
        keep.write_text(raw.read_text())
    return summarize(raw.read_text(), turns)


def ratios(rows: list[Row]) -> list[str]:
    def get(system: str, conc: int) -> Row | None:
        return next((r for r in rows if r.system == system and r.concurrency == conc), None)

    out = []
    t1, m1 = get("turnstile", 1), get("minimal", 1)
    if t1 and m1:
        out.append(f"p50 at concurrency 1: turnstile - minimal = "
                   f"{t1.p50_ms - m1.p50_ms:+.0f} ms (goal <= +30 ms)")
    for conc in (20, 50):
        t, m, p = get("turnstile", conc), get("minimal", conc), get("pydantic-ai", conc)
        if t and p:
            out.append(f"turns/s at concurrency {conc}: turnstile / pydantic-ai = "
                       f"{t.turns_per_s / p.turns_per_s:.2f}x" + (" (goal >= 1.5x)" * (conc == 20)))
        if t and m:
            out.append(f"turns/s at concurrency {conc}: turnstile / minimal = "
                       f"{t.turns_per_s / m.turns_per_s:.2f}x"
                       + (" (goal >= 0.8x)" * (conc == 20)))
    return out


def print_table(rows: list[Row], header: str) -> None:
    print(header)
    cols = ("system", "conc", "turns", "p50 ms", "p95 ms", "turns/s", "activities",
            "events", "bytes", "worker CPU s/turn", "server", "client+model")
    fmt = "{:<12} {:>4} {:>5} {:>8} {:>8} {:>8} {:>10} {:>7} {:>8} {:>17} {:>7} {:>12}"
    print(fmt.format(*cols))
    print("-" * 119)
    for r in rows:
        print(fmt.format(r.system, r.concurrency, r.turns, f"{r.p50_ms:.1f}", f"{r.p95_ms:.1f}",
                         f"{r.turns_per_s:.1f}", f"{r.activities:.1f}", f"{r.events:.1f}",
                         f"{r.history_bytes:,.0f}", f"{r.cpu_s_per_turn:.4f}",
                         f"{r.server_cpu_s_per_turn:.4f}", f"{r.bench_cpu_s_per_turn:.4f}"))
    for line in ratios(rows):
        print(line)


def _variant(spec: str) -> System:
    """`[label:]VAR=VALUE[,VAR=VALUE...]`: a Turnstile worker with those
    variables set, named `label` (default `ts:` + the values)."""
    head, colon, rest = spec.partition(":")
    label, assignments = (head, rest) if colon and "=" not in head else ("", spec)
    env = dict(a.partition("=")[::2] for a in assignments.split(","))
    return dataclasses.replace(SYSTEMS["turnstile"], env=env,
                               name=label or "ts:" + ",".join(env.values()))


def start_worker(system: System, env: dict[str, str], workdir: Path) -> tuple[WorkerProc, str]:
    """`system`'s worker on a task queue of its own: the process and the queue."""
    queue = f"bench-{system.name}-{uuid.uuid4().hex[:6]}"
    return WorkerProc(system.command, {**env, **(system.env or {}), "TURNSTILE_TASK_QUEUE": queue},
                      workdir / f"worker-{system.name}.log", system.ready, cwd=ROOT), queue


async def bench(args: argparse.Namespace, workdir: Path) -> tuple[list[Row], str | None]:
    async with bench_stack(workdir, args.rows, scripted_model()) as (client, server, env):
        systems = [SYSTEMS[n] for n in args.systems]
        for variant in args.variants:  # another Turnstile worker, e.g. TURNSTILE_AUDIT=off
            systems.append(_variant(variant))
        # The other systems' workers on asyncio's loop (as written) or on uvloop.
        env = {**env, "BENCH_EVENT_LOOP": args.peer_loop}
        rows = await measure_all(client, server, systems, env, workdir, args)
        profile = await profile_worker(client, env, workdir, args.profile,
                                       args.profile_raw, args.profile_system) \
            if args.profile else None
    return rows, profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20,
                        help="turns per batch (at least 2x the concurrency)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="batches per system and concurrency, interleaved")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 20, 50])
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--variants", nargs="*", default=[],
                        metavar="[LABEL:]VAR=VALUE[,VAR=VALUE]",
                        help="more Turnstile workers, each with these environment "
                             "variables, measured interleaved with the others")
    parser.add_argument("--peer-loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="the event loop of the floor's and pydantic-ai's workers "
                             "(Turnstile's: TURNSTILE_EVENT_LOOP, default uvloop)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured turns first")
    parser.add_argument("--rows", type=int, default=100_000, help="sales rows seeded")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile N Turnstile turns with py-spy (0: no profile)")
    parser.add_argument("--profile-system", choices=list(SYSTEMS), default="turnstile",
                        help="whose worker --profile samples (default: turnstile)")
    parser.add_argument("--profile-raw", type=Path, default=None,
                        help="keep py-spy's raw stacks here (flamegraph.pl input)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    args.activity_lines = []
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0, load0 = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-") as tmp:
        rows, profile = asyncio.run(bench(args, Path(tmp)))
    load1 = os.getloadavg()
    header = (f"same turn (3 model calls, {QUERIES} querySalesData on {args.rows:,} rows, SQLite), "
              f"dev server in memory + {' '.join(TEMPORAL_SPEED_FLAGS)}; "
              f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
              f"event loops: turnstile {os.environ.get('TURNSTILE_EVENT_LOOP') or 'auto'}, "
              f"others {args.peer_loop}; "
              f"load avg (1/5/15 min) {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f} -> "
              f"{load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}; "
              f"total {time.monotonic() - t0:.0f} s")
    print_table(rows, header)
    print("activities of one turn:")
    for line in args.activity_lines:
        print(f"  {line}")
    if profile:
        print(profile)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        sys.exit(exc.returncode)
