"""Waiting for a condition instead of sleeping a fixed time: a test goes on
as soon as what it waits for holds, and fails with a clear message when it
does not hold within the timeout."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_until(predicate: Callable[[], T | None | Awaitable[T | None]], *,
                     timeout: float = 10.0, interval: float = 0.05, what: str = "") -> T:
    """Poll `predicate` (plain or async) until it returns a truthy value,
    and return that value; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what or predicate!r}")
        await asyncio.sleep(interval)


def wait_until_sync(predicate: Callable[[], T | None], *, timeout: float = 10.0,
                    interval: float = 0.05, what: str = "") -> T:
    """`wait_until` for code that is not async (threads, subprocesses)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what or predicate!r}")
        time.sleep(interval)
