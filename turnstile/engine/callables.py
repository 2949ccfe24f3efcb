"""Calling a service's pipeline components from an activity."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any


def is_async(fn: Callable[..., Any]) -> bool:
    # A function, or an object whose class defines `async def __call__`.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


async def invoke(fn: Callable[..., Any], arg: Any) -> Any:
    """Await an async component; run a sync one in a thread so a slow one
    (a database, a file) cannot block the worker's event loop."""
    if is_async(fn):
        return await fn(arg)
    result = await asyncio.to_thread(fn, arg)
    return await result if inspect.isawaitable(result) else result
