"""`temporal workflow reset` from tests: the reset points and the call, as
the CLI makes it (ResetWorkflowExecution on the real dev server)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowHandle

from tests.support.sql import fetchone
from turnstile.engine.contract import TurnResult
from turnstile.stores.db import Database


async def reset_to(client: Client, wf_id: str, run_id: str,
                   event_id: int) -> WorkflowHandle[Any, TurnResult]:
    """Reset the run to the workflow task that completed at `event_id`; the
    handle of the new run."""
    reset = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=wf_id, run_id=run_id),
            reason="test: reset", workflow_task_finish_event_id=event_id,
            request_id=str(uuid.uuid4())))
    return client.get_workflow_handle(wf_id, run_id=reset.run_id, result_type=TurnResult)


async def task_after(client: Client, wf_id: str, run_id: str, activity_type: str,
                     nth: int = 1) -> int:
    """The event id of the workflow task completed right after the `nth`
    completion of an activity of `activity_type` (waits up to 10 s for it)."""
    handle = client.get_workflow_handle(wf_id, run_id=run_id)
    for _ in range(200):
        types: dict[int, str] = {}
        seen = 0
        async for e in handle.fetch_history_events():
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                types[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                done = e.activity_task_completed_event_attributes.scheduled_event_id
                seen += types.get(done) == activity_type
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and seen >= nth:
                return e.event_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"no workflow task after {activity_type} #{nth} within 10 s")


def lock_of(db: Database, conversation_id: str) -> dict[str, Any] | None:
    """The conversation's lock row: who holds it (workflow, chain, run)."""
    with db.connect() as conn:
        return fetchone(conn, "SELECT workflow_id, execution_chain, run_id FROM "
                              "conversation_lock WHERE conversation_id = :c",
                              {"c": conversation_id})
