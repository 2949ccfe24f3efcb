"""Recorded histories of the main scenarios replay against today's workflow
code. A change that would break turns in flight (a reordered activity, a
renamed signal, a new command before an old one) fails here. A new revision
of the version (turnstile.engine.versions: commands that change only for turns
begun at it) keeps the recordings of the earlier one in
`tests/histories/v<N>-revision<R>/`, which must keep replaying, and records
anew. Otherwise re-record with `python -m tests.record_histories` only for a
deliberate, versioned change:
bump `turnstile.engine.versions.TURN_VERSION` and move the old recordings to
`tests/histories/v<N>/` (tests/test_upgrade.py checks the worker recognises
them and refuses to start while such turns run).

Besides the main scenarios, the paths of approvals v2 are recorded
(tests/record_histories.py, `record_approvals_v2`): a turn waiting for an
approval that a new message steered and the new turn that steered it, a
turn queued behind one waiting for an approval, a new message refused
meanwhile, and an e-mail approved with the reviewer's edits; and the
loop's rules for small models (`record_small_models`): a repeated call, an
empty answer asked for again, calls written as text read as calls; and
dead ends (`record_dead_ends`, revision 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from turnstile.workflows import AgentTurn

HERE = Path(__file__).parent / "histories"
# Turns of this version begun at an earlier revision (turnstile.engine.versions;
# a folder per revision): turns in flight when workers are upgraded. They must
# keep replaying along the path they took.
EARLIER = sorted(HERE.glob("v2-revision*"))
UNPATCHED = sorted(p for folder in EARLIER for p in folder.glob("*.json"))
HISTORIES = sorted(HERE.glob("*.json"))
MAIN = {"demo", "approval_rejected", "compensation", "breaker_trip", "truncated",
        "content_filtered"}
# Recorded at revision 3: the earlier revisions' folders do not have them.
APPROVALS_V2 = {"steered", "steered_new_turn", "queued", "new_message_refused",
                "approved_with_edits"}
# The loop's rules for small models, also recorded at revision 3:
# a repeated call settled without running, an empty answer asked for again,
# calls written as text read as calls (with results sent as text).
SMALL_MODELS = {"repeat_breaker", "empty_answer", "text_tool_calls"}
# Recorded at revision 5: the repeat breaker by meaning — a repeat
# with the address in capitals, a look-alike reviewed with `similar_effects`,
# two calls of one response differing by a trailing space.
BY_MEANING = {"repeat_by_meaning"}
# Recorded at revision 6: dead ends — a disabled tool no longer
# offered, a call without arguments and a bare `functions.echo:`, then the
# request without tools answered; and the llama-cpp-python finding ended
# `DeadEndCalls`.
DEAD_ENDS = {"dead_end_recovered", "dead_end_calls"}
# Recorded at revision 7: information-flow rules — an injected recipient
# reviewed (its provenance derived in review_call) and approved, an injected
# IBAN refused without running.
FLOW = {"flow_review", "flow_refused"}


def test_the_main_scenarios_are_recorded() -> None:
    assert {p.stem for p in HISTORIES} >= (MAIN | APPROVALS_V2 | SMALL_MODELS | BY_MEANING
                                           | DEAD_ENDS | FLOW)


def test_the_turns_of_the_earlier_revisions_are_kept() -> None:
    assert [p.name for p in EARLIER] == ["v2-revision0", "v2-revision1"]
    for folder in EARLIER:
        kept = {p.stem for p in folder.glob("*.json")}
        assert MAIN <= kept <= {p.stem for p in HISTORIES}, folder.name


@pytest.mark.parametrize("path", HISTORIES + UNPATCHED,
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.stem}: {result.replay_failure}"
