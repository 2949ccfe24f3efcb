"""Recorded histories of the main scenarios replay against today's workflow
code. A change that would break turns in flight (a reordered activity, a
renamed signal, a new command before an old one) fails here. Re-record with
`python -m tests.record_histories` only for a deliberate, versioned change:
bump `turnstile.engine.versions.TURN_VERSION` and move the old recordings to
`tests/histories/v<N>/` (tests/test_upgrade.py checks the worker recognises
them and refuses to start while such turns run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows import AgentTurn

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_the_main_scenarios_are_recorded() -> None:
    assert {p.stem for p in HISTORIES} >= {"demo", "approval_rejected", "compensation",
                                           "breaker_trip", "truncated", "content_filtered"}


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.stem}: {result.replay_failure}"
