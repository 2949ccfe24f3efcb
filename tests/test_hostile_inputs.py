"""Generated hostile input through a real dev server and worker,
on SQLite and PostgreSQL: every TurnInput field (attachments and deep or
huge `variables` included) and query arguments. Every turn ends in a
documented state within seconds, nothing is left retrying, its conversation
is released and the next turn on it completes (tests/support/hostile.py says
what is drawn and checked). A bounded run here; `python -m
bench.hostile_inputs --examples N` runs longer and prints its figures."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tests.support.databases import BACKENDS, migrate, sqlite_file_url
from tests.support.hostile import FRESH, Deep, HostileRig, Huge, query_args, turn_payloads
from tests.support.temporal_server import DevServer
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer

BASE = {"conversation_id": FRESH, "user_id": "alice", "message": "hi"}
EXAMPLES = 15  # per backend: a few dozen turns in all, each followed by a clean one


@pytest.fixture(scope="module", params=BACKENDS)
def rig(request: pytest.FixtureRequest, temporal_server: DevServer,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileRig]:
    url: str
    if request.param == "postgresql":
        factory: Any = request.getfixturevalue("postgres_database_factory")
        context: AbstractContextManager[str] = factory()
        url = context.__enter__()
    else:
        context = None  # type: ignore[assignment]
        url = sqlite_file_url(tmp_path_factory.mktemp("hostile") / "t.db")
    migrate(Database(url))
    llm = FakeOpenAIServer()
    try:
        with HostileRig(temporal_server.address, url, llm) as running:
            yield running
    finally:
        llm.close()
        if context is not None:
            context.__exit__(None, None, None)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(payload=turn_payloads(), arguments=st.lists(query_args(), min_size=1, max_size=2))
# The issue's own cases, always among the examples.
@example(payload={**BASE, "attachments": [{"type": "image_url", "url": "https://x/\ud800"}]},
         arguments=[Deep(3000)])
@example(payload={**BASE, "attachments": [{"type": "x\ud800", "url": "https://x/a.png"}]},
         arguments=["\ud800"])
@example(payload={**BASE, "variables": {"v": Deep(3000)}}, arguments=[None])
@example(payload={**BASE, "variables": {"v": Huge(600_000)}}, arguments=[float("nan")])
def test_hostile_turn_inputs_end_documented(rig: HostileRig, payload: dict[str, Any],
                                            arguments: list[Any]) -> None:
    rig.check(payload, arguments)


def test_the_run_saw_refusals_and_completions(rig: HostileRig) -> None:
    """The generated inputs reached both sides of the door (the run above
    tested something): some turns were refused by it, some completed."""
    endings = rig.figures.endings
    assert rig.figures.turns >= EXAMPLES, endings
    assert endings.get("refused/InvalidTurnInput", 0) > 0, endings
    assert endings.get("completed", 0) > 0, endings
