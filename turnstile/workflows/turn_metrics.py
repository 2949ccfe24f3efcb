"""Turnstile's metrics from workflow code, through Temporal's workflow metric
meter: nothing is recorded while a turn's history is replayed, so a turn
counts once however often a worker replays it. Served with the SDK's own
metrics on the worker's Prometheus endpoint (TURNSTILE_METRICS_PORT; without
it the meter records nothing). Names are `turnstile_*`; labels are bounded
(service and tool names from the spec, statuses from enums)."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow


def _label(value: str) -> str:
    return value[:64] if value else "(none)"


def turn_started(service: str) -> None:
    workflow.metric_meter().create_counter(
        "turnstile_turns_started", "turns that began (held their conversation)").add(
        1, {"service": _label(service)})


def turn_ended(service: str, status: str) -> None:
    meter = workflow.metric_meter()
    attrs = {"service": _label(service), "status": status}
    meter.create_counter("turnstile_turns_ended", "turns that ended, by status").add(1, attrs)
    took = workflow.now() - workflow.info().start_time
    meter.create_histogram_timedelta(
        "turnstile_turn_latency", "from a turn's start to its end").record(took, attrs)


def tool_call(service: str, tool: str, outcome: str) -> None:
    workflow.metric_meter().create_counter(
        "turnstile_tool_calls", "tool calls by tool and outcome").add(
        1, {"service": _label(service), "tool": _label(tool), "outcome": outcome})


def approval_requested(tool: str) -> None:
    workflow.metric_meter().create_counter(
        "turnstile_approvals_requested",
        "approval waits begun (pending = requested - decided)").add(1, {"tool": _label(tool)})


def approval_decided(tool: str, verdict: str, requested_at: datetime) -> None:
    meter = workflow.metric_meter()
    attrs = {"tool": _label(tool), "verdict": verdict}
    meter.create_counter("turnstile_approvals_decided", "approval waits ended").add(1, attrs)
    meter.create_histogram_timedelta(
        "turnstile_approval_wait", "from an approval request to its decision").record(
        workflow.now() - requested_at, attrs)


def compensation(tool: str, outcome: str) -> None:
    workflow.metric_meter().create_counter(
        "turnstile_compensations", "undo attempts by outcome").add(
        1, {"tool": _label(tool), "outcome": outcome})


def repairs(n: int) -> None:
    if n:
        workflow.metric_meter().create_counter(
            "turnstile_repairs", "calls an ended turn left without a result, answered").add(n)
