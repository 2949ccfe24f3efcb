"""Is the turn holding a conversation's lock still running? Asked of
Temporal (describe), by the lock's take-over (activities.conversation_memory) and by the
truth check (`python starter.py check`).

A lock held by a turn's chain (turnstile.stores.lock) is held while a run
of that chain runs: a reset run keeps its turn's lock. A lock taken before
the chain was recorded is held while its own run runs."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from turnstile.stores.lock import Holder

RUNNING = "RUNNING"
# A running holder whose workflow task has failed more than once (its pending
# workflow task is on attempt 3 or later) is stuck, not running: it fails the
# same way on every attempt until a worker with other code takes it.
STUCK_ATTEMPT = 3
NOT_FOUND = "NOT_FOUND"  # Temporal knows no such workflow (or run): e.g. retention ended
# The workflow id runs again, but as another turn: the holder's own chain ended.
REPLACED = "REPLACED"


async def holder_state(client: Client, holder: Holder) -> str:
    """RUNNING while the holder holds the lock rightfully; otherwise why not:
    the status Temporal reports for it (TERMINATED, FAILED, TIMED_OUT,
    CANCELED, COMPLETED, CONTINUED_AS_NEW), NOT_FOUND or REPLACED.
    RPC errors other than NOT_FOUND are raised (Temporal could not say)."""
    run_id = holder.run_id if holder.chain is None else None
    try:
        desc = await client.get_workflow_handle(holder.workflow_id, run_id=run_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return NOT_FOUND
        raise
    status = desc.status
    if status != WorkflowExecutionStatus.RUNNING:
        return status.name if status is not None else "UNKNOWN"
    if holder.chain is None:
        return RUNNING
    first = desc.raw_description.workflow_execution_info.first_run_id
    # The running run is of the holder's chain (or is the holder itself, on a
    # server that does not report the chain).
    return RUNNING if first == holder.chain or desc.run_id == holder.run_id else REPLACED


async def holder_gone(client: Client, holder: Holder) -> bool:
    """Has the turn holding a lock ended without releasing it?"""
    return await holder_state(client, holder) != RUNNING


async def stuck_failure(client: Client, holder: Holder) -> str | None:
    """Why a running holder is stuck — its workflow task's attempt and the
    last failure its history recorded — or None when it is not."""
    run_id = holder.run_id if holder.chain is None else None
    handle = client.get_workflow_handle(holder.workflow_id, run_id=run_id)
    desc = await handle.describe()
    if not desc.raw_description.HasField("pending_workflow_task"):
        return None
    attempt = desc.raw_description.pending_workflow_task.attempt
    if attempt < STUCK_ATTEMPT:
        return None
    last = "none recorded"
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failure = event.workflow_task_failed_event_attributes.failure
            last = failure.message.splitlines()[0][:300] if failure.message else "(no message)"
    return f"workflow task attempt {attempt}, last failure: {last}"
