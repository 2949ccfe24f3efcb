"""What identifies "the same turn" on the real server.

The call journal keys every effect by the turn's execution chain. Temporal's
`workflow.info().first_execution_run_id` is the candidate; this checks, on a
real dev server, how it behaves across the four ways a workflow id gets a
new run:

- continue-as-new and a workflow retry (the workflow's own retry policy)
  continue the chain: the new run reports the first run's id;
- `temporal workflow reset` continues the chain as well: the reset run keeps
  the first run's id (its history is a copy up to the reset point);
- a new start of a closed workflow id is a new chain: its own run id.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker


class RunIds(BaseModel):
    run_id: str
    first_execution_run_id: str
    continued_run_id: str | None
    attempt: int


@workflow.defn(name="ChainProbe", sandboxed=False)
class ChainProbe:
    def __init__(self) -> None:
        self.released = False

    @workflow.run
    async def run(self, mode: str) -> RunIds:
        info = workflow.info()
        ids = RunIds(run_id=info.run_id, first_execution_run_id=info.first_execution_run_id,
                     continued_run_id=info.continued_run_id, attempt=info.attempt)
        if mode == "continue" and info.continued_run_id is None:
            workflow.continue_as_new("done")
        if mode == "fail-once" and info.attempt == 1:
            raise ApplicationError("first attempt fails")
        if mode == "wait":
            await workflow.wait_condition(lambda: self.released)
        return ids

    @workflow.signal
    def release(self) -> None:
        self.released = True


async def _first_task_completed(client: Client, wf_id: str, run_id: str) -> int:
    """The event id of the run's first completed workflow task (waits for it)."""
    handle = client.get_workflow_handle(wf_id, run_id=run_id)
    for _ in range(100):
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                return event.event_id
        await asyncio.sleep(0.05)
    raise AssertionError("no completed workflow task after 5 s")


async def test_first_execution_run_id_names_the_chain(client: Client, task_queue: str) -> None:
    async with Worker(client, task_queue=task_queue, workflows=[ChainProbe],
                      max_cached_workflows=0):
        start = {"task_queue": task_queue, "result_type": RunIds}

        # A plain run is its own chain.
        wf = f"chain-{uuid.uuid4().hex[:8]}"
        h = await client.start_workflow("ChainProbe", "plain", id=wf, **start)
        plain = await h.result()
        assert plain.first_execution_run_id == plain.run_id == h.result_run_id

        # A new start of the closed id is a new chain.
        h2 = await client.start_workflow("ChainProbe", "plain", id=wf, **start)
        again = await h2.result()
        assert again.run_id != plain.run_id
        assert again.first_execution_run_id == again.run_id

        # Continue-as-new keeps the chain.
        h = await client.start_workflow("ChainProbe", "continue", id=f"{wf}-can", **start)
        continued = await h.result()
        assert continued.continued_run_id == h.first_execution_run_id
        assert continued.run_id != h.first_execution_run_id
        assert continued.first_execution_run_id == h.first_execution_run_id

        # The workflow's own retry keeps the chain.
        h = await client.start_workflow(
            "ChainProbe", "fail-once", id=f"{wf}-retry", **start,
            retry_policy=RetryPolicy(maximum_attempts=2, initial_interval=timedelta(
                milliseconds=100)))
        retried = await h.result()
        assert retried.attempt == 2
        assert retried.run_id != h.first_execution_run_id
        assert retried.first_execution_run_id == h.first_execution_run_id

        # A reset keeps the chain.
        rid = f"{wf}-reset"
        h = await client.start_workflow("ChainProbe", "wait", id=rid, **start)
        first_run = h.first_execution_run_id
        assert first_run is not None
        point = await _first_task_completed(client, rid, first_run)
        reset = await client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=rid, run_id=first_run),
                reason="test: reset to the first workflow task",
                workflow_task_finish_event_id=point,
                request_id=str(uuid.uuid4())))
        assert reset.run_id != first_run
        new_run = client.get_workflow_handle(rid, run_id=reset.run_id, result_type=RunIds)
        await new_run.signal(ChainProbe.release)
        after_reset = await new_run.result()
        assert after_reset.run_id == reset.run_id
        assert after_reset.first_execution_run_id == first_run
