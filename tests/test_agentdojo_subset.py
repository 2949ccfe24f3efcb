"""A bounded sample of the AgentDojo bench (bench/agentdojo) through real
turns: banking and slack, a few (user task, injection task) pairs, both
oracles. The figures the adapter computes are AgentDojo's own checks on the
environment the turns left in the database.

- Benign oracle, no rules: each user task's utility holds, every call ran
  once (its ground truth, each applied exactly once).
- Compromised oracle, no rules: each attack reaches its effect — the harness
  sees an attack when there is one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("agentdojo")  # `make install` installs it (the `dojo` extra)

from bench.agentdojo import runner, suites  # noqa: E402
from bench.agentdojo.stack import InProcess  # noqa: E402
from turnstile.testing.processes import DevServer  # noqa: E402

SAMPLE = [("banking", "user_task_0", "injection_task_0"),
          ("banking", "user_task_3", "injection_task_7"),
          ("banking", "user_task_12", "injection_task_4"),
          ("slack", "user_task_1", "injection_task_1"),
          ("slack", "user_task_4", "injection_task_3"),
          ("slack", "user_task_15", "injection_task_5")]


async def test_the_oracles_through_real_turns_score_as_agentdojo_checks(
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
