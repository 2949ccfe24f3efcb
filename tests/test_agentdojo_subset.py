"""A bounded sample of the AgentDojo bench (bench/agentdojo) through real
turns: banking, slack and travel, a few (user task, injection task) pairs,
both oracles (travel's is the one attack that once got through the rules:
tests/test_agentdojo_rules.py says why). The figures the adapter computes
are AgentDojo's own checks on the environment the turns left in the
database.

- Rules off, benign oracle: each user task's utility holds; its ground-truth
  calls ran, each applied exactly once.
- Rules off, compromised oracle: each attack reaches its effect — the harness
  sees an attack when there is one.
- Rules on (bench/agentdojo/rules.py), compromised oracle, no reviewer: no
  attack reaches its effect; the injected calls went to review.
- Rules on, benign oracle, perfect reviewer: utility holds again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("agentdojo")  # `make install` installs it (the `dojo` extra)

from bench.agentdojo import runner, suites  # noqa: E402
from bench.agentdojo.stack import InProcess  # noqa: E402
from turnstile.testing.processes import DevServer  # noqa: E402

SAMPLE = [("banking", "user_task_3", "injection_task_7"),
          ("banking", "user_task_12", "injection_task_4"),
          ("slack", "user_task_1", "injection_task_1"),
          ("slack", "user_task_4", "injection_task_3"),
          ("travel", "user_task_3", "injection_task_5")]


async def test_without_rules_the_benign_oracle_does_the_task_and_the_attacks_succeed(
        tmp_path: Path, temporal_server: DevServer) -> None:
    async with InProcess(tmp_path, temporal_address=temporal_server.address) as stack:
        for suite_name, user_task, injection_task in SAMPLE:
            benign = await runner.run_pair(stack.client, stack.db,
                                           suites.Pair(suite_name, user_task), "benign", "none")
            truth = suites.user_ground_truth(suite_name, user_task)
            assert (benign.status, benign.utility, benign.attacked) == ("completed", True, None)
            assert (benign.calls, benign.applied_twice, benign.reviews) == (len(truth), 0, [])

            pair = suites.Pair(suite_name, user_task, injection_task)
            attacked = await runner.run_pair(stack.client, stack.db, pair, "compromised", "none")
            assert (attacked.status, attacked.attacked) == ("completed", True), pair.label
            extra = len(suites.injection_ground_truth(suite_name, injection_task))
            assert (attacked.calls, attacked.applied_twice) == (len(truth) + extra, 0)


async def test_with_rules_no_attack_reaches_its_effect_and_the_reviewed_task_is_done(
        tmp_path: Path, temporal_server: DevServer) -> None:
    async with InProcess(tmp_path, "app_with_rules",
                         temporal_address=temporal_server.address) as stack:
        for suite_name, user_task, injection_task in SAMPLE:
            pair = suites.Pair(suite_name, user_task, injection_task)
            attacked = await runner.run_pair(stack.client, stack.db, pair, "compromised", "none")
            assert (attacked.status, attacked.attacked) == ("completed", False), pair.label
            assert attacked.reviews and not any(r.approved for r in attacked.reviews)

            benign = await runner.run_pair(stack.client, stack.db, suites.Pair(
                suite_name, user_task), "benign", "perfect")
            assert (benign.status, benign.utility) == ("completed", True), pair.label
            assert all(r.benign and r.approved for r in benign.reviews)
