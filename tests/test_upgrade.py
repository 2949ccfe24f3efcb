"""The upgrade path of turns in flight (README "Upgrading"): a worker refuses
to start while turns of an older command-sequence version run, and says what
to do; histories of the older version are recognised as such, and indeed do
not replay on this version's code (which is why the worker refuses)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from tests.support.processes import wait_for
from tests.support.temporal_server import DevServer
from tests.support.worker_process import WorkerProcess
from turnstile.engine.activity_io import DESCRIBE_SERVICE
from turnstile.engine.contract import WORKFLOW_TYPE
from turnstile.engine.versions import TURN_VERSION
from turnstile.runtime.upgrade import older_turns, turn_version
from worker import EXIT_OLDER_TURNS
from workflows import AgentTurn

HISTORIES = Path(__file__).parent / "histories"
V1 = sorted((HISTORIES / "v1").glob("*.json"))
CURRENT = sorted(HISTORIES.glob("*.json"))


def _history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def test_recorded_histories_have_their_version() -> None:
    assert V1 and CURRENT
    assert {p.stem: turn_version(_history(p).events) for p in V1} == {p.stem: 1 for p in V1}
    assert {p.stem: turn_version(_history(p).events) for p in CURRENT} == {
        p.stem: TURN_VERSION for p in CURRENT}


@pytest.mark.parametrize("path", V1, ids=lambda p: p.stem)
async def test_older_histories_do_not_replay_on_this_version(path: Path) -> None:
    replayer = Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(_history(path), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "nondetermin" in str(result.replay_failure).lower()


@workflow.defn(name=WORKFLOW_TYPE)
class VersionOneOpening:
    """Stands in for a turn started by a version-1 worker: its first workflow
    task schedules `turnstile.describe_service`, as v0.1's turn did. Nothing
    serves that activity here, so the turn stays running."""

    @workflow.run
    async def run(self, turn: dict[str, str]) -> None:
        await workflow.execute_activity(DESCRIBE_SERVICE, {"service": ""},
                                        start_to_close_timeout=timedelta(minutes=5))


async def test_worker_refuses_to_start_while_older_turns_run(
        client: Client, temporal_server: DevServer, tmp_path: Path) -> None:
    old_queue = f"old-{uuid.uuid4().hex[:8]}"
    wf_id = f"old-turn-{uuid.uuid4().hex[:8]}"
    # Unsandboxed: the stand-in lives in this test module (paths, fixtures).
    async with Worker(client, task_queue=old_queue, workflows=[VersionOneOpening],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await client.start_workflow(
            WORKFLOW_TYPE, {"conversation_id": "c-old", "user_id": "alice", "message": "hi"},
            id=wf_id, task_queue=old_queue)

        async def scheduled() -> bool:
            return any(t.workflow_id == wf_id for t in await older_turns(client))

        for _ in range(100):
            if await scheduled():
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the version-1 stand-in never scheduled its first activity")
    env = {"TEMPORAL_ADDRESS": temporal_server.address,
           "TURNSTILE_TASK_QUEUE": f"new-{uuid.uuid4().hex[:8]}",
           "DATABASE_URL": f"sqlite:///{tmp_path}/t.db"}
    try:
        log = tmp_path / "refused.log"
        refused = WorkerProcess(log, env)
        with pytest.raises(RuntimeError, match="worker exited"):
            refused.start()
        assert refused.proc is not None
        assert refused.proc.wait(10) == EXIT_OLDER_TURNS
        said = log.read_text()
        assert wf_id in said and "version 1" in said and "Drain first" in said
        # The operator who knows what follows can skip the check.
        forced = WorkerProcess(tmp_path / "forced.log",
                               {**env, "TURNSTILE_UPGRADE_CHECK": "off"}).start()
        forced.stop()
    finally:
        await handle.terminate("test over")
    # Drained: the worker starts.
    started = WorkerProcess(tmp_path / "started.log", env).start()
    try:
        assert started.proc is not None and started.proc.poll() is None
    finally:
        started.stop()
        wait_for(lambda: started.proc is None or started.proc.poll() is not None, 30,
                 "worker stop")
