"""`python -m bench.damaged_rows --examples N [--database-url URL]`: the
damaged-row property of tests/test_damaged_rows_turns.py, run longer.

Starts its own dev server, a SQLite database in a temporary directory unless
`--database-url` names one (e.g. a PostgreSQL database), the scripted fake
model server and one worker; for each of N examples drawn by Hypothesis
(tests/support/damage.py: a column of chat_message, a kind of damage, a row)
runs a turn, writes the damage, and checks the property: the next turn ends
within 5 s (`DamagedRow` naming the conversation and seq when the row is
damaged, else completed), `starter.py check` names it, quarantine lets the
next turn complete. Prints the figures: examples by outcome, damage by
column and kind, seconds to end of the turns on damaged conversations
(median, slowest). Exit 1 with the falsifying example if a check fails."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support.damage import Damage, Outcome, damage, exercise, tool_then_answer
from tests.support.databases import migrate
from tests.support.processes import free_port
from tests.support.services import echo
from tests.support.temporal_server import DevServer, connect
from tests.support.turns import Turns, running_worker
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer


class Rig:
    """A worker on its own loop and thread; `run` is called from Hypothesis'."""

    def __init__(self, address: str, url: str, llm: FakeOpenAIServer) -> None:
        self.address, self.url, self.llm = address, url, llm
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.ready = threading.Event()
        self.box: dict[str, Any] = {}

    def run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> Rig:
        self.llm.default = tool_then_answer
        self.thread.start()
        self.serving = asyncio.run_coroutine_threadsafe(self._serve(), self.loop)
        if not self.ready.wait(60):
            raise TimeoutError(f"the worker did not start: {self.serving}")
        return self

    async def _serve(self) -> None:
        self.box["stop"] = asyncio.Event()
        client = await connect(self.address)
        service = Service(name="test", tools=ToolRegistry([echo]))
        async with running_worker(client, "bench-damaged", self.url, [service],
                                  llm_url=self.llm.url) as turns:
            self.box["turns"], self.box["client"] = turns, client
            self.ready.set()
            await self.box["stop"].wait()

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.box["stop"].set)
        self.serving.result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args(argv)
    seen: list[tuple[Damage, Outcome]] = []
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'damaged.db'}"
        db = Database(url)
        migrate(db)
        os.environ["DATABASE_URL"] = url  # what `starter.py check` and quarantine read
        server = DevServer(free_port(), Path(tmp) / "server.log")
        llm = FakeOpenAIServer()
        try:
            with Rig(server.address, url, llm) as rig:
                failure = _run(rig, db, args.examples, seen)
        finally:
            llm.close()
            server.stop()
    damaged = [o.seconds for _, o in seen if o.kind == "damaged"]
    print(json.dumps({
        "examples": len(seen), "database": url.split(":", 1)[0],
        "outcomes": dict(Counter(o.kind for _, o in seen)),
        "damaged_by_column": dict(Counter(d.column for d, o in seen if o.kind == "damaged")),
        "damaged_by_kind": dict(Counter(d.kind for d, o in seen if o.kind == "damaged")),
        "seconds_to_end_damaged_median": round(statistics.median(damaged or [0.0]), 3),
        "seconds_to_end_damaged_slowest": round(max(damaged or [0.0]), 3),
        "failure": failure}, indent=2))
    return 1 if failure else 0


def _run(rig: Rig, db: Database, examples: int, seen: list[tuple[Damage, Outcome]]
         ) -> str | None:
    turns: Turns = rig.box["turns"]

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(d=damage(), pick=st.integers(0, 20))
    def property_(d: Damage, pick: int) -> None:
        seen.append((d, exercise(rig, turns, rig.box["client"], db, d, pick)))

    try:
        property_()
    except Exception as exc:  # the falsifying example, reported in the figures
        return f"{type(exc).__name__}: {str(exc)[:2000]}"
    return None


if __name__ == "__main__":
    sys.exit(main())
