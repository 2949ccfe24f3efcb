"""Activity options (timeouts, retries) derived from the service spec.

Every activity has explicit timeouts and a RetryPolicy, so every attempt is
visible in the history; nothing below Temporal retries on its own.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypedDict

from temporalio.common import RetryPolicy

from turnstile.engine.specs import LoopPolicy, ToolSpec


class ActivityOptions(TypedDict, total=False):
    """The keyword arguments of `workflow.execute_activity` that Turnstile sets."""

    start_to_close_timeout: timedelta
    schedule_to_close_timeout: timedelta
    heartbeat_timeout: timedelta | None
    retry_policy: RetryPolicy


class LocalActivityOptions(TypedDict, total=False):
    """The keyword arguments of `workflow.execute_local_activity` that Turnstile sets."""

    start_to_close_timeout: timedelta
    schedule_to_close_timeout: timedelta
    retry_policy: RetryPolicy


def as_local(options: ActivityOptions) -> LocalActivityOptions:
    """The same timeouts and retries for a local activity (which has no heartbeat)."""
    local = LocalActivityOptions(start_to_close_timeout=options["start_to_close_timeout"],
                                 retry_policy=options["retry_policy"])
    if "schedule_to_close_timeout" in options:
        local["schedule_to_close_timeout"] = options["schedule_to_close_timeout"]
    return local


def memory_options() -> ActivityOptions:
    # A database outage is waited out (bounded), never turned into lost work.
    return {
        "start_to_close_timeout": timedelta(seconds=30),
        "schedule_to_close_timeout": timedelta(hours=1),
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_interval=timedelta(seconds=30)),
    }


def bookkeeping_options() -> LocalActivityOptions:
    """The turn's own bookkeeping (begin_turn, memory writes the workflow owes,
    release) runs as local activities: one marker each in history, no task
    round trip through the server. A database outage is waited out the same
    way as memory_options (bounded); waits longer than a minute become timers."""
    return as_local(memory_options())


# Activities that may wait on a remote catalogue (MCP sessions and listings:
# resolve_tools, review_call) heartbeat; a lost worker costs this long.
LISTING_HEARTBEAT = timedelta(seconds=10)


def model_options(loop: LoopPolicy) -> ActivityOptions:
    # A heartbeat timeout only adds a field to the ScheduleActivityTask command:
    # recorded histories replay unchanged (tests/test_replay.py).
    return {
        "start_to_close_timeout": timedelta(seconds=loop.model_timeout_seconds),
        "heartbeat_timeout": timedelta(seconds=loop.model_heartbeat_seconds),
        "schedule_to_close_timeout": timedelta(seconds=loop.model_retry_window_seconds),
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_interval=timedelta(seconds=60)),
    }


def listing_options() -> ActivityOptions:
    """resolve_tools and review_call: memory's timeouts and retries, plus a heartbeat."""
    return {**memory_options(), "heartbeat_timeout": LISTING_HEARTBEAT}


def tool_options(tool: ToolSpec) -> ActivityOptions:
    # Every tool heartbeats (activities.runtime.with_heartbeat), so every tool
    # has a heartbeat timeout: a lost worker costs seconds, not start-to-close.
    r = tool.retry
    return {
        "start_to_close_timeout": tool.start_to_close,
        "heartbeat_timeout": timedelta(
            seconds=tool.heartbeat_seconds or ToolSpec.DEFAULT_HEARTBEAT_SECONDS),
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=r.initial_interval_seconds),
            backoff_coefficient=r.backoff_coefficient,
            maximum_interval=timedelta(seconds=r.maximum_interval_seconds),
            maximum_attempts=r.maximum_attempts,
        ),
    }


def compensation_options(tool: ToolSpec | None, loop: LoopPolicy) -> ActivityOptions:
    """A compensation keeps its tool's timeouts, retried `compensation_attempts` times."""
    heartbeat = (tool.heartbeat_seconds if tool else None) or ToolSpec.DEFAULT_HEARTBEAT_SECONDS
    return {
        "start_to_close_timeout": tool.start_to_close if tool else timedelta(seconds=60),
        "heartbeat_timeout": timedelta(seconds=heartbeat),
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_attempts=loop.compensation_attempts),
    }


def pipeline_options() -> ActivityOptions:
    """A service's pipeline component (retriever, guardrail, moderator...): a
    broken one fails the turn after a few attempts instead of stalling it."""
    return {
        "start_to_close_timeout": timedelta(seconds=60),
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_interval=timedelta(seconds=10),
                                    maximum_attempts=3),
    }


def pipeline_local_options() -> LocalActivityOptions:
    """pipeline_options for a component run as a local activity (the retriever)."""
    return as_local(pipeline_options())


def event_options() -> LocalActivityOptions:
    """Turn events (local activity): listeners are quick and never fail the turn."""
    return {
        "start_to_close_timeout": timedelta(seconds=10),
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
    }
