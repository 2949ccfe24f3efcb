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
dead ends (`record_dead_ends`, revision 6); and a tool result the model
wrote itself (revision 9): asked again, then answered or ended
`FabricatedToolResult`, and, recorded with revision 8's code, a turn that
completed with it (`fabricated_result_before`)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

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
# Revision 8: a grant issued with an approval covers the turn's other waiting
# call, then the next turn's call (turnstile.workflows.standing_approvals).
GRANTS = {"grant_issued", "grant_covered"}
# Revision 9: the measured made-up `<tool_response>` asked for again, then an
# answer (`reasked`) or the same again (`failed`); and the same reply in a turn
# begun at revision 8 (recorded with that revision's code, commit 7f9f22c),
# which completed with it and must keep replaying so.
FABRICATED = {"fabricated_result_reasked", "fabricated_result_failed",
              "fabricated_result_before"}
# Revision 10: the same read in every response — at revision 9 (recorded with
# that revision's code, commit ee15c95) to the round-trip cap, at 10 the read
# withheld after three and the answer.
SAME_READS = {"same_reads_before", "same_reads_answered"}


def test_the_main_scenarios_are_recorded() -> None:
    assert {p.stem for p in HISTORIES} >= (MAIN | APPROVALS_V2 | SMALL_MODELS | BY_MEANING
                                           | DEAD_ENDS | FLOW | GRANTS | FABRICATED
                                           | SAME_READS)


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


def _payloads(path: Path) -> list[Any]:
    """The JSON values of a history's payloads, in event order."""
    found = re.findall(r'"data": "([A-Za-z0-9+/=]+)"', path.read_text())
    return [json.loads(base64.b64decode(d)) for d in found]


@pytest.mark.parametrize(("name", "revision", "status"), [
    ("fabricated_result_before", 8, "completed"),
    ("fabricated_result_reasked", 9, "completed"),
    ("fabricated_result_failed", 9, "failed"),
])
def test_a_made_up_result_took_the_path_of_its_turn_s_revision(name: str, revision: int,
                                                               status: str) -> None:
    """Begun at revision 8 the turn completed with the made-up result; at 9 it
    never does."""
    values = _payloads(HERE / f"{name}.json")
    begun = next(v for v in values if isinstance(v, dict) and "revision" in v)
    result = values[-1]
    assert (begun["revision"], result["status"]) == (revision, status)
    assert ("<tool_response>" in (result["answer"] or "")) == (revision < 9)



@pytest.mark.parametrize(("name", "revision", "status", "round_trips"), [
    ("same_reads_before", 9, "failed", 6),
    ("same_reads_answered", 10, "completed", 3),
])
def test_the_same_reads_took_the_path_of_their_turn_s_revision(
        name: str, revision: int, status: str, round_trips: int) -> None:
    """Begun at revision 9 the turn read until the cap; at 10 it answers."""
    values = _payloads(HERE / f"{name}.json")
    begun = next(v for v in values if isinstance(v, dict) and "revision" in v)
    result = values[-1]
    assert (begun["revision"], result["status"], result["round_trips"]) == (
        revision, status, round_trips)
