"""Where a sales turn's worker CPU goes, in worker CPU-ms per turn, by concern.

    make bench-install                       # once: py-spy (the bench extra)
    .venv/bin/python -m bench.profile_turn   # 100 turns at concurrency 20
    .venv/bin/python -m bench.profile_turn --turns 200 --raw /tmp/turn.pyspy.txt
    .venv/bin/python -m bench.profile_turn --no-profile --rounds 3   # CPU-ms only
    .venv/bin/python -m bench.profile_turn --env TURNSTILE_AUDIT=off
    .venv/bin/python -m bench.profile_turn --processes 2 --no-profile   # worker.py --processes 2

The turn of bench/turns.py (the reference `sales-assistant`: audit, memory,
retrieval, lock and tracing on, as a default worker runs; 3 model calls to the
scripted model server, 2 `querySalesData` on a seeded SQLite database), on a
dev server in memory with the speed flags, served by `python worker.py
--no-sender` in its own process.

Why CPU-ms and not turns/s: on a shared machine wall-clock throughput moves
with everyone else's load; the CPU time the worker process itself spends
(user + system, all threads, from /proc/PID/stat) per completed turn barely
does. Two figures:

1. **worker CPU-ms per turn**, unprofiled: `--rounds` batches of `--turns`
   turns at `--concurrency`, each batch's worker CPU / turns (the median and
   every round are printed), with the dev server's and this process's (the
   client and the scripted model server) beside it; with `--processes N` the
   workers' figure is the sum over the N worker processes (and their
   supervisor);
2. **the profile**: one more batch with py-spy attached (`--gil`: only the
   thread holding the GIL is sampled, so samples approximate Python CPU time);
   every sample is put under one concern (`concern()`), printed in ms per turn
   with the top functions of each. The process's CPU that py-spy cannot see
   (the SDK's Rust core, C code with the GIL released) is the difference
   between the process's CPU in that batch and the samples.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench.bench_support import (
    DevServer,
    WorkerProc,
    connect,
    process_cpu_seconds,
    threads_cpu_seconds,
)
from bench.profile_summary import _split
from bench.turns import ROOT, SYSTEMS, run_batch, scripted_model
from turnstile.sales.seed import seed
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer

log = logging.getLogger("bench.profile_turn")

# A sample belongs to the first OWNER found anywhere in its stack (work done
# for that purpose, whatever it calls: the pydantic serialization inside the
# payload converter is payload conversion, the masking inside a log formatter
# is log formatting), otherwise to the concern of its innermost frame that
# matches one of INNER (walking outward).
OWNERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("payload conversion", ("temporalio/converter", "temporalio/contrib/pydantic",
                            "turnstile/runtime/client.py",
                            "temporalio/bridge/_visitor", "temporalio/worker/_command_aware",
                            "turnstile/stores/payload_store", "google/protobuf/json_format")),
    # Not activities/log_context: its interceptor wraps every activity.
    ("log formatting", ("logging/", "turnstile/runtime/log_masking")),
    ("masking", ("turnstile/engine/masking", "turnstile/engine/safe_text", "phonenumbers/")),
    ("journal", ("turnstile/stores/journal", "turnstile/stores/ledger",
                 "turnstile/stores/audit", "turnstile/stores/call_key")),
)
INNER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tracing", ("opentelemetry/", "temporalio/contrib/opentelemetry",
                 "turnstile/runtime/tracing")),
    ("metrics", ("prometheus", "temporalio/runtime.py", "turnstile/runtime/metrics")),
    ("database", ("sqlalchemy/", "sqlite3/", "psycopg", "turnstile/stores/", "turnstile/db.py",
                  "turnstile/sales/query", "alembic/")),
    ("model call (HTTP)", ("httpx/", "httpcore/", "h11/", "anyio/", "turnstile/providers/",
                           "ssl.py", "json/")),
    ("pydantic validation", ("pydantic/", "pydantic_core/")),
    ("workflow-task handling / sandbox", ("temporalio/worker/_workflow", "temporalio/workflow.py",
                                          "temporalio/worker/workflow_sandbox", "workflows/",
                                          "temporalio/bridge/worker.py")),
    ("Turnstile activities (other)", ("activities/", "turnstile/")),
    ("activity handling", ("temporalio/worker/_activity", "temporalio/activity.py",
                           "concurrent/futures", "threading.py")),
    ("event loop", ("asyncio/", "selectors.py")),
)
OTHER = "other"


def concern(frames: list[tuple[str, str]]) -> str:
    """The concern of one sample's stack (frames outermost first: (function, file))."""
    for name, prefixes in OWNERS:
        if any(path.startswith(prefixes) for _, path in frames):
            return name
    for _, path in reversed(frames):
        for name, prefixes in INNER:
            if path.startswith(prefixes):
                return name
    return OTHER


def _path(path: str) -> str:
    return path.split("site-packages/", 1)[1] if "site-packages/" in path else path.lstrip("/")


def by_concern(raw: str) -> tuple[int, Counter[str], dict[str, Counter[str]]]:
    """Samples in all, per concern, and per concern the innermost frames."""
    total = 0
    counts: Counter[str] = Counter()
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [(f, _path(p)) for f, p in (_split(x) for x in stack.split(";"))]
        name = concern(frames)
        total += n
        counts[name] += n
        func, path = frames[-1]
        leaves[name][f"{func} ({path})"] += n
    return total, counts, leaves


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def worker_processes_cpu(worker: WorkerProc) -> dict[int, float]:
    """CPU seconds of the worker process and of its children (`--processes
    N`: the N workers under their supervisor), by pid, read from /proc while
    they run."""
    pid = worker.proc.pid
    pids = [pid, *map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
    out = {}
    for p in pids:
        try:
            out[p] = process_cpu_seconds(p)
        except FileNotFoundError:  # exited meanwhile
            continue
    return out


def report(raw: str, turns: int, rate: int, process_ms: float, top: int = 3) -> str:
    total, counts, leaves = by_concern(raw)

    def ms(n: float) -> float:
        return 1000 * n / rate / turns

    sampled = ms(total)
    out = [f"profile: {turns} turns, py-spy --gil at {rate}/s: {sampled:.1f} ms of Python "
           f"CPU per turn sampled; the worker process used {process_ms:.1f} ms per turn in "
           f"the same batch ({max(process_ms - sampled, 0):.1f} ms outside the GIL: SDK core, "
           "C code, py-spy's own pauses)", "",
           f"{'concern':<36} {'ms/turn':>8} {'share':>6}  top innermost frames (ms/turn)"]
    for name, n in counts.most_common():
        tops = ", ".join(f"{leaf} {ms(k):.1f}" for leaf, k in leaves[name].most_common(top))
        out.append(f"{name:<36} {ms(n):8.1f} {100 * n / max(total, 1):5.1f}%  {tops}")
    return "\n".join(out)


async def profile(args: argparse.Namespace, workdir: Path) -> None:
    db_url = f"sqlite:///{workdir / 'bench.db'}"
    seed(Database(db_url), rows=args.rows)
    server = DevServer(workdir / "temporal.log")
    fake = FakeOpenAIServer(keep_alive=True)
    fake.default = scripted_model()
    system = SYSTEMS["turnstile"]
    worker: WorkerProc | None = None
    try:
        client = await connect(server.address)
        queue = f"bench-profile-{os.getpid()}"
        extra = dict(a.partition("=")[::2] for a in args.env)
        env = {"TEMPORAL_ADDRESS": server.address, "DATABASE_URL": db_url,
               "LLM_BASE_URL": fake.url, "TURNSTILE_DATA_DIR": str(workdir),
               "PYTHONPATH": str(args.root), "TURNSTILE_TASK_QUEUE": queue, **extra}
        command, ready = system.command, system.ready
        if args.processes > 1:
            command = [*command, "--processes", str(args.processes)]
            ready = f"all {args.processes} worker processes serving task queue"
        worker = WorkerProc(command, env, workdir / "worker.log", ready, cwd=args.root)
        await run_batch(client, system, queue, args.warmup, 1)  # imports, pools, caches
        await run_batch(client, system, queue, args.concurrency, args.concurrency)
        per_round, split, threads = [], [], []
        for _ in range(args.rounds):
            threads0 = threads_cpu_seconds(worker.proc.pid)
            procs0 = worker_processes_cpu(worker)
            cpu0 = (sum(procs0.values()), server.cpu_seconds(), _own_cpu_seconds())
            _, wall, _ = await run_batch(client, system, queue, args.turns, args.concurrency)
            procs1 = worker_processes_cpu(worker)
            threads.append({name: 1000 * (cpu - threads0.get(name, 0.0)) / args.turns
                            for name, cpu in threads_cpu_seconds(worker.proc.pid).items()})
            cpu1 = (sum(procs1.values()), server.cpu_seconds(), _own_cpu_seconds())
            per_round.append([1000 * (b - a) / args.turns for a, b in zip(cpu0, cpu1, strict=True)]
                             + [args.turns / wall])
            split.append(", ".join(
                f"pid {p} {1000 * (cpu - procs0.get(p, 0)) / args.turns:.1f}"
                for p, cpu in procs1.items()))
        load = os.getloadavg()
        print(f"worker CPU-ms per sales turn at concurrency {args.concurrency}, "
              f"{args.processes} worker process(es) "
              f"({args.turns} turns per round; load {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}"
              f"{'; ' + ' '.join(args.env) if args.env else ''}):")
        for i, (w, srv, own, tps) in enumerate(per_round, 1):
            print(f"  round {i}: workers {w:.1f} ms, dev server {srv:.1f} ms, client + model "
                  f"server {own:.1f} ms, {tps:.1f} turns/s"
                  + (f" (by process, the supervisor first: {split[i - 1]})"
                     if args.processes > 1 else ""))
        print("  median: " + ", ".join(
            f"{name} {statistics.median(r[i] for r in per_round):.1f}{unit}"
            for i, (name, unit) in enumerate((("workers", " ms"), ("dev server", " ms"),
                                               ("client + model server", " ms"),
                                               ("turns/s", ""))))
              + " per turn")
        if args.processes == 1:  # the one worker's threads, by name
            names = sorted({n for r in threads for n in r},
                           key=lambda n: -statistics.median(r.get(n, 0.0) for r in threads))
            print("  by thread (median ms per turn): " + ", ".join(
                f"{n} {statistics.median(r.get(n, 0.0) for r in threads):.1f}"
                for n in names if statistics.median(r.get(n, 0.0) for r in threads) >= 0.1))
        if args.no_profile or args.processes > 1:
            return
        spy_bin = shutil.which("py-spy", path=str(Path(sys.executable).parent)) \
            or shutil.which("py-spy")
        if spy_bin is None:
            raise SystemExit("py-spy not found: `make bench-install` (or --no-profile)")
        raw = workdir / "worker.pyspy.txt"
        spy = subprocess.Popen(
            [spy_bin, "record", "--gil", "-r", str(args.rate), "-f", "raw", "-o", str(raw),
             "--pid", str(worker.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        await asyncio.sleep(1.5)  # attached
        if spy.poll() is not None:
            raise SystemExit(f"py-spy could not attach: {spy.stderr.read().decode()[-500:]}"
                             if spy.stderr else "py-spy could not attach")
        cpu0 = worker.cpu_seconds()
        await run_batch(client, system, queue, args.turns, args.concurrency)
        process_ms = 1000 * (worker.cpu_seconds() - cpu0) / args.turns
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        spy.wait(timeout=120)
        text = raw.read_text()
        if args.raw:
            args.raw.write_text(text)
        print()
        print(report(text, args.turns, args.rate, process_ms))
    finally:
        if worker is not None:
            worker.stop()
        fake.close()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=100, help="turns per batch")
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2, help="unprofiled batches")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rows", type=int, default=100_000, help="sales rows seeded")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--raw", type=Path, default=None, help="keep py-spy's raw stacks here")
    parser.add_argument("--no-profile", action="store_true", help="CPU-ms per turn only")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="worker.py --processes N (figures only, no profile)")
    parser.add_argument("--env", nargs="*", default=[], metavar="VAR=VALUE",
                        help="set in the worker's environment (e.g. TURNSTILE_AUDIT=off)")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout whose worker.py runs (e.g. an earlier commit's, "
                             "`git archive` into a directory: before/after a change)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="turnstile-profile-") as tmp:
        asyncio.run(profile(args, Path(tmp)))
    print(f"total {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
