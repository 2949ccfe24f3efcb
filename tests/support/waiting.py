"""Waiting for a condition instead of sleeping a fixed time: poll it every
`interval` seconds until it holds, and fail loudly after `timeout` seconds.
A fixed sleep is either too short on a loaded machine or wasted on an idle one."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


class ConditionNotReached(AssertionError):
    """The condition did not hold within the timeout."""


def _failure(what: str, timeout: float) -> ConditionNotReached:
    return ConditionNotReached(f"{what or 'condition'} not reached within {timeout:g} s")


async def wait_until(predicate: Callable[[], object | Awaitable[object]], *,
                     timeout: float = 10.0, interval: float = 0.05, what: str = "") -> None:
    """Poll `predicate` (sync or async) until it returns something true."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() >= deadline:
            raise _failure(what, timeout)
        await asyncio.sleep(interval)


def wait_until_sync(predicate: Callable[[], object], *, timeout: float = 10.0,
                    interval: float = 0.05, what: str = "") -> None:
    """`wait_until` for a thread without an event loop (blocks it)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise _failure(what, timeout)
        time.sleep(interval)
