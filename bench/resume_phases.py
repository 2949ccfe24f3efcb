"""Where an approved turn's resume time goes, read from its history.

`bench/parked.py` times approval signal -> the model asked again from
outside. This splits the same step by the server's event times, for each
sampled turn, from its first signal on:

- `dispatch`: workflow task scheduled -> started (matching hands the task to
  the worker: its sticky queue when the turn is cached there, else the
  normal queue; a sticky queue nobody polls shows here as its timeout);
- `worker`: workflow task started -> completed (the worker's own work:
  replaying the history of a turn not in its cache, then the new commands);
- `activity dispatch`: activity task scheduled -> started (the tool, then
  the model call);
- `tool`: the tool's activity, started -> completed;
- `total`: signal -> the model call's activity started.

Every figure is a median / p95 over the sampled turns, in ms, and how many
of their post-signal workflow tasks went to a sticky queue.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.bench_support import percentile

PHASES = ("dispatch", "worker", "activity dispatch", "tool", "total")


def _ms(later: HistoryEvent, earlier: HistoryEvent) -> float:
    return (later.event_time.ToNanoseconds() - earlier.event_time.ToNanoseconds()) / 1e6


def phases(events: Sequence[HistoryEvent]) -> tuple[dict[str, list[float]], int, int]:
    """Each phase's durations after the turn's first signal; workflow tasks
    after it (all, on a sticky queue)."""
    out: dict[str, list[float]] = {p: [] for p in PHASES}
    signal = next((e for e in events
                   if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED), None)
    if signal is None:
        return out, 0, 0
    by_id = {e.event_id: e for e in events}
    tasks = sticky = 0
    for e in events:
        if e.event_id <= signal.event_id:
            continue
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            scheduled = by_id[e.workflow_task_started_event_attributes.scheduled_event_id]
            out["dispatch"].append(_ms(e, scheduled))
            tasks += 1
            kind = scheduled.workflow_task_scheduled_event_attributes.task_queue.kind
            sticky += kind == TaskQueueKind.TASK_QUEUE_KIND_STICKY
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            started = by_id[e.workflow_task_completed_event_attributes.started_event_id]
            out["worker"].append(_ms(e, started))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            scheduled = by_id[e.activity_task_started_event_attributes.scheduled_event_id]
            out["activity dispatch"].append(_ms(e, scheduled))
            name = scheduled.activity_task_scheduled_event_attributes.activity_type.name
            if name.endswith("call_model"):
                out["total"].append(_ms(e, signal))
                break
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            started = by_id[e.activity_task_completed_event_attributes.started_event_id]
            out["tool"].append(_ms(e, started))
    return out, tasks, sticky


async def resume_phases(client: Client, ids: Sequence[str]) -> str:
    """One line: each phase's median / p95 over the turns `ids`."""
    merged: dict[str, list[float]] = {p: [] for p in PHASES}
    tasks = sticky = 0
    for wf_id in ids:
        history = await client.get_workflow_handle(wf_id).fetch_history()
        found, n, s = phases(list(history.events))
        tasks, sticky = tasks + n, sticky + s
        for p, values in found.items():
            merged[p] += values
    parts = [f"{p} {statistics.median(v):.0f}/{percentile(v, 0.95):.0f}"
             for p, v in merged.items() if v]
    return (f"  where it went (ms, median/p95, from the histories): {', '.join(parts)}; "
            f"{sticky} of {tasks} workflow tasks on the sticky queue")
