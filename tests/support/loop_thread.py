"""An event loop in a thread, hosting a worker, so that a sync Hypothesis
test (which cannot be async) can drive async turns."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.temporal_server import connect
from tests.support.turns import Turns, running_worker
from turnstile.runtime.services import Service


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@contextmanager
def hosted_worker(address: str, task_queue: str, database_url: str, services: list[Service],
                  *, start_timeout: float = 60, **options: Any
                  ) -> Iterator[tuple[LoopThread, Turns]]:
    """A worker (tests.support.turns.running_worker, `options` passed on)
    on a loop in a thread, for a sync Hypothesis test: (the loop, its Turns;
    `Turns.client` is the worker's client). Stopped, and its loop closed, on
    the way out."""
    lt = LoopThread()
    started, stop = asyncio.Event(), asyncio.Event()
    box: dict[str, Turns] = {}

    async def host() -> None:
        client = await connect(address)
        async with running_worker(client, task_queue, database_url, services,
                                  **options) as turns:
            box["turns"] = turns
            started.set()
            await stop.wait()

    hosting = asyncio.run_coroutine_threadsafe(host(), lt.loop)
    try:
        lt.run(asyncio.wait_for(started.wait(), start_timeout), start_timeout + 10)
        yield lt, box["turns"]
    finally:
        lt.loop.call_soon_threadsafe(stop.set)
        hosting.result(30)
        lt.close()
