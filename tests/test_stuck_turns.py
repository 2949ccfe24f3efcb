"""The truth check sees stuck turns: a lock holder Temporal calls
running but whose workflow task has failed more than once is reported as
`stuck: <workflow id> ...` with its last failure, and `check` exits 1 —
not skipped as "held by running turn". On SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.support.waiting import wait_until
from turnstile.cli import starter
from turnstile.stores.db import Database


@workflow.defn(name="test.TaskAlwaysFails")
class TaskAlwaysFails:
    """Stands in for a turn whose workflow task fails on every attempt (what
    a worker with incompatible code does to it): RuntimeError fails the
    task, not the workflow, so Temporal retries it forever."""

    @workflow.run
    async def run(self) -> None:
        raise RuntimeError("the code cannot read this history")


async def test_a_holder_whose_workflow_task_keeps_failing_is_reported_stuck(
        client: Client, task_queue: str, db: Database, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    conv = f"c-stuck-{uuid.uuid4().hex[:6]}"
    wf_id = f"t-stuck-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=task_queue, workflows=[TaskAlwaysFails],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        # The SDK reports only a task's first failure: later attempts end by
        # their timeout, Temporal's default 10 s unless set. 3 s: attempt 3
        # comes sooner, and the first check still runs during attempt 2.
        handle = await client.start_workflow("test.TaskAlwaysFails", id=wf_id,
                                             task_queue=task_queue,
                                             task_timeout=timedelta(seconds=3))
        run_id = handle.result_run_id
        with db.connect() as conn:  # the lock it took before its task began to fail
            conn.execute("INSERT INTO conversation_lock (conversation_id, workflow_id, run_id, "
                         "acquired_at, execution_chain) VALUES (:c, :wf, :run, 't', :run)",
                         {"c": conv, "wf": wf_id, "run": run_id})

        async def attempt() -> int:
            desc = await handle.describe()
            return int(desc.raw_description.pending_workflow_task.attempt)

        await wait_until(lambda: _at_least(attempt, 2), timeout=20, interval=0.2,
                         what="one workflow task failure")
        monkeypatch.setenv("DATABASE_URL", db.url)
        capsys.readouterr()
        once = await starter.main(["check", "--conversation", conv], client=client)
        first = capsys.readouterr().out.splitlines()
        await wait_until(lambda: _at_least(attempt, 3), timeout=30, interval=0.2,
                         what="a workflow task that failed more than once")
        code = await starter.main(["check", "--conversation", conv], client=client)
        printed = capsys.readouterr().out.splitlines()
        await handle.terminate("test over")
    # Failed once: still counted as running (a task can fail once for a lost worker).
    assert once == 0 and f"skipped: conversation {conv}: held by running turn {wf_id}" in first
    assert code == 1, printed
    stuck = [line for line in printed if line.startswith(f"stuck: {wf_id} ")]
    assert len(stuck) == 1, printed
    assert f"(conversation {conv})" in stuck[0] and "workflow task attempt" in stuck[0]
    assert "the code cannot read this history" in stuck[0]
    assert not [line for line in printed if line.startswith("skipped:")]


async def _at_least(attempt: Callable[[], Awaitable[int]], n: int) -> bool:
    return await attempt() >= n
