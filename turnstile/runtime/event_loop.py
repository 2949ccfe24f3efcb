"""The event loop the worker runs on: uvloop where it is installed.

A worker's Python time is mostly the event loop's and the SDK's around small
pieces of work (activations, activities, database and HTTP round-trips);
uvloop (libuv under asyncio's interface) runs the same program with less CPU
per callback, timer, thread hand-off and socket read: measured on the bench
turn, ~3 ms less worker CPU per turn (bench/README.md). Nothing else changes:
tasks, futures and cancellation are asyncio's own.

`TURNSTILE_EVENT_LOOP`: `auto` (default: uvloop when importable, as on Linux
and macOS; asyncio's own loop elsewhere), `uvloop` (required: an error if it
is missing) or `asyncio`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from turnstile.engine.errors import ConfigurationError

T = TypeVar("T")
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(kind: str) -> LoopFactory:
    """The factory of the loop `kind` names (Settings.event_loop)."""
    if kind == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if kind == "uvloop":
            raise ConfigurationError(
                "TURNSTILE_EVENT_LOOP=uvloop, but uvloop is not installed "
                "(pip install uvloop; or TURNSTILE_EVENT_LOOP=asyncio)") from None
        return asyncio.new_event_loop
    factory: LoopFactory = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], kind: str) -> T:
    """`asyncio.run(main)` on the loop `kind` names."""
    try:
        factory = loop_factory(kind)
    except ConfigurationError:
        main.close()  # never run: closed, not left to warn "never awaited"
        raise
    if factory is asyncio.new_event_loop:
        return asyncio.run(main)  # exactly as before: the loop also set as the thread's
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
