"""A short chaos run (bench/chaos.py runs it for minutes): concurrent sales
turns with approvals while the worker process is SIGKILLed at random moments
and restarted, hostile inputs and respelled reviewers mixed in. Afterwards
every turn is closed, the hostile ones refused, no requester approved her own
call, the SMTP server received no Message-ID twice, and the truth check
reports nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from temporalio.client import Client

from tests.support.temporal_server import DevServer

ROOT = Path(__file__).resolve().parents[1]


def load_chaos():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_chaos", ROOT / "bench" / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def test_turns_survive_random_worker_kills(client: Client, temporal_server: DevServer,
                                                 tmp_path: Path) -> None:
    chaos = load_chaos()
    report = await chaos.run_chaos(client, temporal_server.address, tmp_path, turns=6,
                                   seconds=8.0, seed_value=3, close_budget=300.0,
                                   hostile_every=3, min_kills=2, calm_turns=1)
    assert report.kills >= 2
    assert report.closed == report.turns == 7, report
    assert report.hostile == 2 and report.hostile_not_refused == 0, report
    assert report.self_approved == 0, report
    assert report.duplicate_mails == 0, report
    assert report.disagreements == [], report.disagreements
    assert report.unsettled_mails == 0, report
    # Turns got through approvals to real delivery: at least the calm turn's
    # mail (a kill between a sender's claim and its send parks the whole
    # claimed batch as possibly sent, never resent).
    assert report.mails >= 1, report
