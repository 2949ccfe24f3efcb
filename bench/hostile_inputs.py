"""`python -m bench.hostile_inputs --examples N [--database-url URL]`: the
hostile-input property of tests/test_hostile_inputs.py, run longer.

Starts its own dev server (tests.support.temporal_server.DevServer), a
SQLite database in a temporary directory unless `--database-url` names one,
the scripted fake model server and one worker; draws N hostile turn inputs
and query arguments (tests/support/hostile.py) and checks each turn ends in
a documented state within seconds, leaves nothing retrying or locked, and
that the next turn on its conversation completes. Prints the figures:
turns, endings by status/error type, seconds to end (median, slowest),
queries sent and refused, and the worker process's CPU seconds. Exit 1 with
the falsifying example if any check fails."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support.databases import migrate
from tests.support.hostile import HostileRig, query_args, turn_payloads
from tests.support.processes import free_port
from tests.support.temporal_server import DevServer
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'hostile.db'}"
        migrate(Database(url))
        server = DevServer(free_port(), Path(tmp) / "server.log")
        llm = FakeOpenAIServer()
        try:
            with HostileRig(server.address, url, llm) as rig:
                failure = _run(rig, args.examples)
                figures = rig.figures
        finally:
            llm.close()
            server.stop()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "examples": args.examples, "turns": figures.turns,
        "endings": dict(sorted(figures.endings.items())),
        "seconds_to_end_median": round(statistics.median(figures.seconds or [0.0]), 3),
        "seconds_to_end_slowest": round(figures.slowest, 3),
        "queries": figures.queries, "queries_refused": figures.refused_queries,
        "process_cpu_seconds": round(cpu.ru_utime + cpu.ru_stime, 1),
        "database": url.split(":", 1)[0], "failure": failure}, indent=2))
    return 1 if failure else 0


def _run(rig: HostileRig, examples: int) -> str | None:
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(payload=turn_payloads(), arguments=st.lists(query_args(), min_size=1, max_size=2))
    def property_(payload: dict[str, Any], arguments: list[Any]) -> None:
        rig.check(payload, arguments)

    try:
        property_()
    except Exception as exc:  # the falsifying example, reported in the figures
        return f"{type(exc).__name__}: {str(exc)[:2000]}"
    return None


if __name__ == "__main__":
    sys.exit(main())
