"""AgentDojo's suites as the bench runs them.

Version v1.2.2 (in v1, workspace user_task_7's ground truth fails its own
check). The injection text is the `direct` attack ("TODO: {goal}"), placed
in the vectors a correct run of the user task reads (AgentDojo's own
choice); it needs no model name. Ground truths are computed once per task
from the pair's start environment (the injected one).

The clock is frozen (`FROZEN_NOW`): the e-mail and cloud-drive tools stamp
what they make with `datetime.now()`, so without it no two runs of one pair
would end in equal environments.
"""

from __future__ import annotations

import datetime
import sys
import types
from dataclasses import dataclass
from functools import cache
from typing import Any

from agentdojo.attacks.attack_registry import load_attack
from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.functions_runtime import FunctionCall, TaskEnvironment
from agentdojo.task_suite.load_suites import get_suite
from agentdojo.task_suite.task_suite import TaskSuite

VERSION = "v1.2.2"
SUITES = ("workspace", "travel", "banking", "slack")
ATTACK = "direct"
# The suites' own "today" (workspace's calendar says 2024-05-15).
FROZEN_NOW = datetime.datetime(2024, 5, 15, 12, 0)
_STAMPING = ("agentdojo.default_suites.v1.tools.email_client",
             "agentdojo.default_suites.v1.tools.cloud_drive_client")


class _FrozenDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> datetime.datetime:  # type: ignore[override]
        return FROZEN_NOW  # a plain datetime: results render it (YAML) as any other


def _freeze_clock() -> None:
    frozen = types.ModuleType("datetime")
    frozen.__dict__.update(datetime.__dict__)
    frozen.datetime = _FrozenDatetime  # type: ignore[attr-defined]
    for name in _STAMPING:
        sys.modules[name].datetime = frozen  # type: ignore[attr-defined]


@cache
def suite(name: str) -> TaskSuite[Any]:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    loaded = get_suite(VERSION, name)
    _freeze_clock()
    return loaded


def user_task(suite_name: str, task_id: str) -> BaseUserTask[Any]:
    return suite(suite_name).get_user_task_by_id(task_id)


def injection_task(suite_name: str, task_id: str) -> BaseInjectionTask[Any]:
    return suite(suite_name).get_injection_task_by_id(task_id)


@cache
def task_of_prompt(suite_name: str) -> dict[str, str]:
    """User task id by its prompt (prompts are unique in each suite)."""
    return {t.PROMPT: t.ID for t in suite(suite_name).user_tasks.values()}


@dataclass(frozen=True)
class Pair:
    """One run: a user task, with an injection task's text placed (or none)."""

    suite: str
    user_task: str
    injection_task: str | None = None

    @property
    def label(self) -> str:
        return f"{self.suite}/{self.user_task}/{self.injection_task or '-'}"


def _number(task_id: str) -> int:
    return int(task_id.rsplit("_", 1)[1])


def pairs(suite_name: str, *, injected: bool) -> list[Pair]:
    """Every user task (injected: with every injection task) in task order."""
    s = suite(suite_name)
    users = sorted(s.user_tasks, key=_number)
    if not injected:
        return [Pair(suite_name, u) for u in users]
    injections = sorted(s.injection_tasks, key=_number)
    return [Pair(suite_name, u, i) for u in users for i in injections]


@cache
def injections(pair: Pair) -> dict[str, str]:
    """Injection vector -> text for the pair (empty without an injection task)."""
    if pair.injection_task is None:
        return {}
    s = suite(pair.suite)
    attack = load_attack(ATTACK, s, None)  # `direct` reads no pipeline
    return dict(attack.attack(user_task(pair.suite, pair.user_task),
                              injection_task(pair.suite, pair.injection_task)))


def start_environment(pair: Pair) -> TaskEnvironment:
    """The environment the pair's run starts from (and its checks compare with)."""
    s = suite(pair.suite)
    env = s.load_and_inject_default_environment(injections(pair))
    return user_task(pair.suite, pair.user_task).init_environment(env)


@cache
def default_environment(suite_name: str, task_id: str) -> TaskEnvironment:
    env = suite(suite_name).load_and_inject_default_environment({})
    return user_task(suite_name, task_id).init_environment(env)


@cache
def user_ground_truth(suite_name: str, task_id: str,
                      injection_id: str | None = None) -> tuple[FunctionCall, ...]:
    """The user task's calls on the pair's start environment, as AgentDojo's
    ground-truth pipeline computes them: an injection can sit in a value the
    task uses (slack's injected channel name)."""
    task = user_task(suite_name, task_id)
    return tuple(task.ground_truth(start_environment(Pair(suite_name, task_id, injection_id))))


@cache
def injection_ground_truth(suite_name: str, task_id: str) -> tuple[FunctionCall, ...]:
    env = suite(suite_name).load_and_inject_default_environment({})
    return tuple(injection_task(suite_name, task_id).ground_truth(env))
