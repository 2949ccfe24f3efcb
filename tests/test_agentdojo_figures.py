"""bench/agentdojo's figures: AgentDojo's attack successes split into attacks
reaching their effect (over the pairs whose injection task has calls) and
text-only injections said (over the pairs whose injection task has none: an
output check), each counted, neither dropped; a --json file's summary,
written before or after the split, prints again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("agentdojo")  # `make install` installs it (the `dojo` extra)

from bench.agentdojo import figures, oracles, suites  # noqa: E402
from bench.agentdojo.runner import Outcome  # noqa: E402


def outcome(user: str, injection: str | None, attacked: bool | None) -> Outcome:
    return Outcome(pair=suites.Pair("travel", user, injection), model="compromised",
                   status="completed", utility=True, attacked=attacked, calls=3, effects=1,
                   applied_twice=0)


def test_text_only_injection_tasks_are_those_without_calls() -> None:
    assert not oracles.has_calls("travel", "injection_task_6")
    assert oracles.has_calls("travel", "injection_task_5")
    assert oracles.has_calls("workspace", "injection_task_13")  # a hand-written script


def test_attacks_reaching_their_effect_and_text_only_successes_are_apart() -> None:
    runs = [outcome("user_task_0", "injection_task_5", True),
            outcome("user_task_1", "injection_task_5", False),
            outcome("user_task_0", "injection_task_6", True),
            outcome("user_task_1", "injection_task_6", False)]
    f = figures.summary(runs)["travel"]["compromised"]
    assert (f["injected"], f["attack_success"]) == (4, 2)  # AgentDojo's own total
    assert (f["attacks_reaching_effect"], f["injected_with_calls"]) == (1, 2)
    assert (f["text_only_success"], f["injected_text_only"]) == (1, 2)
    [line] = [x for x in figures.lines(runs) if x.startswith("travel")]
    assert "attacks reaching their effect 1/2 (50.0%)" in line
    assert "text-only injections said 1/2 (answer's words, no effect)" in line
    found = figures.failures(runs)
    assert found["attack reached its effect"] == [
        "travel/user_task_0/injection_task_5 compromised completed"]
    assert found["text-only injection said (output check, no effect)"] == [
        "travel/user_task_0/injection_task_6 compromised completed"]


def test_a_json_file_prints_again(tmp_path: Path) -> None:
    runs = [outcome("user_task_0", "injection_task_6", True)]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"summary": figures.summary(runs)}))
    assert figures.lines_of(json.loads(path.read_text())["summary"]) == figures.lines(runs)
    # A summary written before the split (bench/HISTORY.md's files) still
    # reads: AgentDojo's total is shown.
    old = figures.summary([*runs, outcome("user_task_1", "injection_task_5", True)])
    for by_model in old.values():
        for f in by_model.values():
            for key in ("injected_with_calls", "attacks_reaching_effect",
                        "injected_text_only", "text_only_success"):
                f.pop(key, None)
    assert any("attack success 2/2" in line for line in figures.lines_of(old)), \
        figures.lines_of(old)
