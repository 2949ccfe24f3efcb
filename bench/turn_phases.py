"""Where a turn's latency at concurrency 1 goes, phase by phase, per system.

    make bench-install                         # once (pydantic-ai for its peer)
    .venv/bin/python -m bench.turn_phases      # 40 turns each: turnstile, minimal, pydantic-ai
    .venv/bin/python -m bench.turn_phases --turns 60 --systems turnstile minimal

The stack of bench/turns.py (dev server in memory with the speed flags, the
scripted model, SQLite seeded with 100,000 sales rows, one worker process per
system, all up at once) and its turn: 3 model calls, 2 `querySalesData`.
`--turns` turns per system, one at a time, in `--rounds` interleaved rounds
(the order rotating), so drifting load falls on every system alike. Then each
turn's history is read and split by the server's event times (the technique
of bench/resume_phases.py):

- `start`: execution started -> first workflow task started;
- per workflow task, its dispatch (scheduled -> started; the first one's is
  `start`) and its run on the worker (started -> completed: the worker's
  task, including any local activity run inside it); tasks are named by their
  place (first, middle, last) and the local activities whose markers they
  recorded (Turnstile's first task runs begin_turn, its last one
  release_conversation; the other systems' have none); a task with local
  activities is split further by the times in their markers (`Local`): up
  to each one's scheduling, its run, and from its result to the task's end;
- per activity type, dispatch (scheduled -> started) and run (started ->
  completed);
- `end`: last workflow task completed -> execution completed; the server's
  started -> closed, and the client's latency (start RPC to result).

Per system: every phase's median and p95 in ms (and how many per turn), the
workers' CPU ms per turn. Then per phase kind the sum within each turn
(dispatch, worker tasks, activity runs by kind, the gaps between events, the
client's overhead), its median per system and its share of the mean
latency, and turnstile - minimal for each: the medians' difference, the
means' difference and its share of the mean latency gap (means add up: the
kinds partition a turn's time, so the shares of the gap do too, and they move
less with the machine's load than the milliseconds do).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.api.history.v1 import HistoryEvent

from bench.bench_support import LOCAL_ACTIVITY_MARKER, WorkerProc, bench_stack, percentile
from bench.turns import QUERIES, SYSTEMS, run_batch, scripted_model, start_worker
from turnstile.runtime.devstack import TEMPORAL_SPEED_FLAGS

E = EventType
# Per-turn sums, in order; together they partition the client's latency.
DISPATCH_WFT = "dispatch: workflow tasks (incl. start)"
DISPATCH_ACT = "dispatch: activities"
WORKER = "worker: workflow tasks"
GAPS = "server gaps (between events, end)"
CLIENT = "client - server (RPCs, result poll)"
LATENCY = "client latency"
SERVER = "server: started -> closed"
LOCALS = "    of which local activities' runs"


def _ms(later: HistoryEvent, earlier: HistoryEvent) -> float:
    return (later.event_time.ToNanoseconds() - earlier.event_time.ToNanoseconds()) / 1e6


def short(name: str) -> str:
    """`turnstile.call_model` -> `call_model`, `agent__sales_peer__model_request`
    -> `model_request` (the bench's activity names)."""
    return name.rsplit(".", 1)[-1].rsplit("__", 1)[-1]


@dataclass
class Local:
    """A local activity's marker (the SDK core's LocalActivityMarkerData): its
    name; `original_schedule_time`, when the core took the workflow's command
    (the worker's clock: on this host, the server's); `complete_time`, the
    workflow's time when it was scheduled (its task's WorkflowTaskStarted
    time) plus its runtime, dispatch to the worker's code -> result (ns)."""

    name: str
    scheduled_ns: int
    complete_ns: int


def _ns(stamp: dict[str, int]) -> int:
    return int(stamp.get("seconds", 0)) * 1_000_000_000 + int(stamp.get("nanos", 0))


def local_activity(e: HistoryEvent) -> Local:
    """What a local activity marker's `data` detail (JSON) says."""
    data = e.marker_recorded_event_attributes.details.get("data")
    try:
        info = json.loads(data.payloads[0].data) if data else {}
        return Local(short(str(info["activity_type"])), _ns(info["original_schedule_time"]),
                     _ns(info["complete_time"]))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return Local("?", 0, 0)


def activity_kind(name: str) -> str:
    """Model calls and tool calls, whatever each system names its activities."""
    return "model" if "model" in name.lower() else "tool"


@dataclass
class Turn:
    """One turn's phases (label -> durations in ms, in the order first seen)
    and its per-kind sums (kind -> ms)."""

    phases: dict[str, list[float]] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    sticky: int = 0  # workflow tasks dispatched through the worker's sticky queue
    tasks: int = 0

    def add(self, label: str, ms: float, kind: str | None = None) -> None:
        self.phases.setdefault(label, []).append(ms)
        if kind:
            self.sums[kind] += ms


def turn_phases(events: Sequence[HistoryEvent], latency_ms: float) -> Turn:
    """Split one finished turn's history (and its client latency) into phases."""
    turn = Turn()
    by_id = {e.event_id: e for e in events}
    started, closed = events[0], events[-1]
    completed = [e for e in events if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
    # What each workflow task recorded: the events after its completion, up to the next task.
    recorded: dict[int, list[Local]] = defaultdict(list)
    task = 0
    for e in events:
        if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            task = e.event_id
        elif e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            task = 0
        elif (task and e.event_type == E.EVENT_TYPE_MARKER_RECORDED
              and e.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER):
            recorded[task].append(local_activity(e))
    for e in events:
        if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            scheduled = by_id[e.workflow_task_started_event_attributes.scheduled_event_id]
            turn.tasks += 1
            queue = scheduled.workflow_task_scheduled_event_attributes.task_queue.kind
            turn.sticky += queue == TaskQueueKind.TASK_QUEUE_KIND_STICKY
            if turn.tasks == 1:
                turn.add("start: execution started -> 1st wf task started", _ms(e, started),
                         DISPATCH_WFT)
            else:
                turn.add("wf task dispatch (2nd on)", _ms(e, scheduled), DISPATCH_WFT)
        elif e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            start = by_id[e.workflow_task_completed_event_attributes.started_event_id]
            place = ("first" if e is completed[0] else "last" if e is completed[-1]
                     else "middle")
            locals_ = recorded.get(e.event_id, [])
            markers = "+".join(la.name for la in locals_)
            label = f"wf task run: {place}" + (f" [local {markers}]" if markers else "")
            ms = _ms(e, start)
            turn.add(label, ms, WORKER)
            turn.sums[f"  worker: {place} task" + "s" * (place == "middle")] += ms
            # Inside a task with local activities scheduled in it (Turnstile's
            # are): up to each one's scheduling, its run, after the last one.
            at = begun = start.event_time.ToNanoseconds()
            for la in locals_:
                if la.scheduled_ns and la.complete_ns:
                    run = la.complete_ns - begun
                    turn.add(f"  started or previous local done -> {la.name} scheduled",
                             (la.scheduled_ns - at) / 1e6)
                    turn.add(f"  {la.name} run (dispatched -> result)", run / 1e6, LOCALS)
                    at = la.scheduled_ns + run
            if locals_:
                turn.add(f"  {locals_[-1].name} done -> task completed",
                         (e.event_time.ToNanoseconds() - at) / 1e6)
        elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            scheduled = by_id[e.activity_task_started_event_attributes.scheduled_event_id]
            name = short(scheduled.activity_task_scheduled_event_attributes.activity_type.name)
            turn.add(f"activity dispatch: {name}", _ms(e, scheduled), DISPATCH_ACT)
        elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            start = by_id[e.activity_task_completed_event_attributes.started_event_id]
            scheduled = by_id[e.activity_task_completed_event_attributes.scheduled_event_id]
            name = short(scheduled.activity_task_scheduled_event_attributes.activity_type.name)
            turn.add(f"activity run: {name}", _ms(e, start),
                     f"activity run: {activity_kind(name)} calls")
    turn.add("end: last wf task completed -> execution completed", _ms(closed, completed[-1]))
    server = _ms(closed, started)
    turn.add(SERVER, server)
    turn.add("client latency (start RPC -> result)", latency_ms)
    parts = (DISPATCH_WFT, DISPATCH_ACT, WORKER, "activity run: model calls",
             "activity run: tool calls")
    turn.sums[GAPS] = server - sum(turn.sums[k] for k in parts)
    turn.sums[SERVER] = server
    turn.sums[CLIENT] = latency_ms - server
    turn.sums[LATENCY] = latency_ms
    return turn


@dataclass
class Measured:
    turns: list[Turn] = field(default_factory=list)
    worker_cpu_s: float = 0.0
    server_cpu_s: float = 0.0


def _stat(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} {percentile(values, 0.95):7.1f}"


def system_table(name: str, got: Measured) -> list[str]:
    n = len(got.turns)
    labels: dict[str, list[float]] = {}
    for turn in got.turns:
        for label, values in turn.phases.items():
            labels.setdefault(label, []).extend(values)
    sticky, tasks = sum(t.sticky for t in got.turns), sum(t.tasks for t in got.turns)
    out = [f"{name}: {n} turns; worker CPU {1000 * got.worker_cpu_s / n:.1f} ms/turn, "
           f"dev server CPU {1000 * got.server_cpu_s / n:.1f} ms/turn; "
           f"{tasks / n:.1f} wf tasks/turn, {sticky} of {tasks} through the sticky queue",
           f"  {'phase':<68} {'/turn':>5} {'median':>7} {'p95':>7}"]
    for label, values in labels.items():
        out.append(f"  {label:<68} {len(values) / n:5.1f} {_stat(values)}")
    return out


def sums_table(measured: dict[str, Measured]) -> list[str]:
    names = list(measured)
    kinds: list[str] = []
    for got in measured.values():
        for turn in got.turns:
            kinds += [k for k in turn.sums if k not in kinds]
    first = [DISPATCH_WFT, DISPATCH_ACT, WORKER, "  worker: first task", "  worker: middle tasks",
             "  worker: last task", LOCALS]
    last = ["activity run: model calls", "activity run: tool calls", GAPS, SERVER, CLIENT,
            LATENCY]
    order = first + sorted(k for k in kinds if k not in first + last) + last
    diff = "turnstile" in measured and "minimal" in measured
    cells = {k: {n: [t.sums.get(k, 0.0) for t in got.turns] for n, got in measured.items()}
             for k in order}
    head = f"  {'per turn, sum of (ms)':<42}" + "".join(f" {n[:11] + ' med':>15} {'%':>5}"
                                                          for n in names)
    out = ["per-turn sums by phase kind: median, and % = share of the mean latency",
           head + (f" {'ts-min med':>10} {'mean':>7} {'% of gap':>8}" if diff else "")]
    gap = (statistics.mean(cells[LATENCY]["turnstile"]) - statistics.mean(cells[LATENCY]["minimal"])
           if diff else 0.0)
    deltas = []
    for kind in order:
        line = f"  {kind:<42}" + "".join(
            f" {statistics.median(v):15.1f} {100 * statistics.mean(v) / statistics.mean(lat):5.0f}"
            for v, lat in zip(cells[kind].values(), cells[LATENCY].values(), strict=True))
        if diff:
            ts, mn = cells[kind]["turnstile"], cells[kind]["minimal"]
            d = statistics.median(ts) - statistics.median(mn)
            dm = statistics.mean(ts) - statistics.mean(mn)
            share = 100 * dm / gap if gap else 0.0
            line += f" {d:+10.1f} {dm:+7.1f} {share:7.0f}%"
            if not kind.startswith(" ") and kind not in (SERVER, LATENCY):
                deltas.append(f"{kind.split(' (')[0]} {d:+.0f} ({share:.0f}%)")
        out.append(line)
    if diff:
        out.append("turnstile - minimal per turn, median (share of the mean gap): "
                   + "; ".join(deltas))
    return out


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Measured]:
    systems = [SYSTEMS[n] for n in args.systems]
    async with bench_stack(workdir, args.rows, scripted_model()) as (client, server, env):
        workers: dict[str, tuple[WorkerProc, str]] = {}
        try:
            for system in systems:
                workers[system.name] = start_worker(system, env, workdir)
            for system in systems:  # warm-up: imports, pools, caches (not measured)
                await run_batch(client, system, workers[system.name][1], args.warmup, 1)
            got = {s.name: Measured() for s in systems}
            latency: dict[str, dict[str, float]] = {s.name: {} for s in systems}
            per_round = -(-args.turns // args.rounds)
            for r in range(args.rounds):
                for system in systems[r % len(systems):] + systems[:r % len(systems)]:
                    worker, queue = workers[system.name]
                    todo = min(per_round, args.turns - len(latency[system.name]))
                    if todo <= 0:
                        continue
                    cpu0 = worker.cpu_seconds(), server.cpu_seconds()
                    latencies, _, ids = await run_batch(client, system, queue, todo,
                                                       args.concurrency)
                    got[system.name].worker_cpu_s += worker.cpu_seconds() - cpu0[0]
                    got[system.name].server_cpu_s += server.cpu_seconds() - cpu0[1]
                    # Both lists are in the order the turns ended (appended together).
                    for wf_id, seconds in zip(ids, latencies, strict=True):
                        latency[system.name][wf_id] = 1000 * seconds
        finally:
            for worker, _ in workers.values():
                worker.stop()
        for name, turns in latency.items():
            for wf_id, ms in turns.items():
                history = await client.get_workflow_handle(wf_id).fetch_history()
                got[name].turns.append(turn_phases(list(history.events), ms))
        return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40, help="measured turns per system")
    parser.add_argument("--rounds", type=int, default=4,
                        help="interleaved rounds the turns are split into")
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured turns first")
    parser.add_argument("--rows", type=int, default=100_000, help="sales rows seeded")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="turns in flight per batch (where queueing at c20 goes)")
    args = parser.parse_args(argv)
    t0, load0 = time.monotonic(), os.getloadavg()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix="turnstile-phases-") as tmp:
        measured = asyncio.run(run(args, Path(tmp)))
    load1 = os.getloadavg()
    print(f"{when}: the bench turn (3 model calls, {QUERIES} querySalesData on {args.rows:,} "
          f"rows, SQLite) at concurrency {args.concurrency}, dev server in memory + "
          f"{' '.join(TEMPORAL_SPEED_FLAGS)}; {os.cpu_count()} CPUs; load avg (1/5/15 min) "
          f"{load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f} -> "
          f"{load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}; total {time.monotonic() - t0:.0f} s")
    print("ms, from the histories' event times (median and p95 over all occurrences)")
    for name, got in measured.items():
        print()
        print("\n".join(system_table(name, got)))
    print()
    print("\n".join(sums_table(measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
