"""Activity options (timeouts, retries) derived from the service spec.

Every activity has explicit timeouts and a RetryPolicy, so every attempt is
visible in the history; nothing below Temporal retries on its own.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from turnstile.engine.specs import LoopPolicy, ToolSpec


def memory_options() -> dict[str, Any]:
    # A database outage is waited out (bounded), never turned into lost work.
    return {
        "start_to_close_timeout": timedelta(seconds=30),
        "schedule_to_close_timeout": timedelta(hours=1),
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_interval=timedelta(seconds=30)),
    }


def model_options(loop: LoopPolicy) -> dict[str, Any]:
    return {
        "start_to_close_timeout": timedelta(seconds=loop.model_timeout_seconds),
        "schedule_to_close_timeout": timedelta(seconds=loop.model_retry_window_seconds),
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_interval=timedelta(seconds=60)),
    }


def tool_options(tool: ToolSpec) -> dict[str, Any]:
    r = tool.retry
    return {
        "start_to_close_timeout": tool.start_to_close,
        "heartbeat_timeout": (timedelta(seconds=tool.heartbeat_seconds)
                              if tool.heartbeat_seconds else None),
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=r.initial_interval_seconds),
            backoff_coefficient=r.backoff_coefficient,
            maximum_interval=timedelta(seconds=r.maximum_interval_seconds),
            maximum_attempts=r.maximum_attempts,
        ),
    }


def compensation_options(tool: ToolSpec | None, loop: LoopPolicy) -> dict[str, Any]:
    """A compensation keeps its tool's timeouts, retried `compensation_attempts` times."""
    heartbeat = tool.heartbeat_seconds if tool else None
    return {
        "start_to_close_timeout": tool.start_to_close if tool else timedelta(seconds=60),
        "heartbeat_timeout": timedelta(seconds=heartbeat) if heartbeat else None,
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_attempts=loop.compensation_attempts),
    }


def pipeline_options() -> dict[str, Any]:
    """A service's pipeline component (retriever, guardrail, moderator...): a
    broken one fails the turn after a few attempts instead of stalling it."""
    return {
        "start_to_close_timeout": timedelta(seconds=60),
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_interval=timedelta(seconds=10),
                                    maximum_attempts=3),
    }


def event_options() -> dict[str, Any]:
    """Turn events (local activity): listeners are quick and never fail the turn."""
    return {
        "start_to_close_timeout": timedelta(seconds=10),
        "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
    }
