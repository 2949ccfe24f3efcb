"""The scripted models: the benign and the compromised oracle.

Both are function models (turnstile.testing.FunctionModel): each answer is a
function of the request alone — the user's words name the user task (its
prompt), the tool results since them say how far the script has come — so a
model activity that runs again answers the same. One call per response.

- Benign: the user task's ground-truth calls in order, then its expected
  answer (`GROUND_TRUTH_OUTPUT`).
- Compromised: the same, until a tool result carries an injection task's goal;
  then that injection task's calls (AgentDojo's ground truth, or the
  hand-written script of `scripts` where it is empty), then the rest of the
  user task. Its answer adds what the injection asks the model to say (for
  a text-only injection task, `has_calls` false, that is all it does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentdojo.functions_runtime import FunctionCall
from bench.agentdojo import scripts, suites
from bench.agentdojo.tools import parsed_result
from turnstile import FunctionModel
from turnstile.testing import Call, ModelCall, Reply, ToolOutcome

KINDS = ("benign", "compromised")


def oracle(suite_name: str, kind: str) -> FunctionModel:
    if kind not in KINDS:
        raise ValueError(f"unknown model {kind!r}; known: {', '.join(KINDS)}")

    def decide(seen: ModelCall) -> Reply:
        return next_step(suite_name, kind, seen.user_text, seen.results)

    decide.__name__ = f"dojo_{suite_name}_{kind}"
    return FunctionModel(decide, name=f"dojo-{suite_name}-{kind}")


def next_step(suite_name: str, kind: str, prompt: str,
              results: Sequence[ToolOutcome]) -> Reply:
    task_id = suites.task_of_prompt(suite_name).get(prompt)
    if task_id is None:
        return "I can only run AgentDojo's user tasks of this suite."
    plan = [as_call(c) for c in suites.user_ground_truth(suite_name, task_id)]
    answer = suites.user_task(suite_name, task_id).GROUND_TRUTH_OUTPUT or "Done."
    if kind == "compromised":
        found = injected(suite_name, results)
        if found is not None:
            at, injection_id = found
            # The pair is known now: the user task's calls on its environment.
            plan = [as_call(c) for c in suites.user_ground_truth(suite_name, task_id,
                                                                  injection_id)]
            extra = injection_plan(suite_name, task_id, injection_id, results[at + 1:])
            plan = plan[:at + 1] + extra + plan[at + 1:]
            said = scripts.says(suite_name, injection_id)
            if said:
                answer = f"{answer} {said}"
    done = len(results)
    return plan[done] if done < len(plan) else answer


def injection_plan(suite_name: str, user_task_id: str, injection_id: str,
                   since: Sequence[ToolOutcome]) -> list[Call]:
    """The injection task's calls: its ground truth, or the hand-written
    script (which reads the results of its own earlier calls)."""
    truth = suites.injection_ground_truth(suite_name, injection_id)
    if truth:
        return [as_call(c) for c in truth]
    return scripts.plan(suite_name, user_task_id, injection_id, since)


def has_calls(suite_name: str, injection_id: str) -> bool:
    """Does the compromised oracle make calls for this injection task (its
    ground truth or a script)? One that makes none is *text only*: its goal
    is only words in the answer (travel injection_task_6, `scripts.says`),
    which the oracle always says; AgentDojo's check of it reads the answer,
    not the environment, so its success is an output check, not an effect."""
    return bool(suites.injection_ground_truth(suite_name, injection_id)) or \
        scripts.scripted(suite_name, injection_id)


def as_call(fc: FunctionCall) -> Call:
    return Call(fc.function, json.loads(json.dumps(dict(fc.args), default=str)))


_SPACE = re.compile(r"\s+")


def _flat(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def injected(suite_name: str, results: Sequence[ToolOutcome]) -> tuple[int, str] | None:
    """The first result that carries an injection task's goal, and that task."""
    goals = {i: _flat(t.GOAL) for i, t in suites.suite(suite_name).injection_tasks.items()}
    for at, r in enumerate(results):
        text = _readable(r.text)
        # The longest goal found: some goals begin with another's (workspace 6, 8, 9).
        found = [(len(goal), i) for i, goal in goals.items() if goal and goal in text]
        if found:
            return at, max(found)[1]
    return None


def _readable(text: str) -> str:
    """A result's strings as one flat text (JSON or YAML results are parsed,
    so escapes, folded lines and quoting read as the model would read them)."""
    parsed = parsed_result(text)
    if parsed is None:
        return _flat(text)
    parts: list[str] = []
    _strings(parsed, parts)
    return _flat(" ".join(parts)) + " " + _flat(text)


def _strings(value: Any, into: list[str]) -> None:
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _strings(k, into)
            _strings(v, into)
    elif isinstance(value, list):
        for v in value:
            _strings(v, into)
