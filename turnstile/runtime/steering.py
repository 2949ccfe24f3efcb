"""A new turn meets a conversation whose turn waits for an approval
(docs/steering.md): is the holder parked on one, and the `steer` signal
that asks it to give the conversation up. Asked of Temporal by the new
turn's lock activity (activities.conversation_memory).

The holder's phase is what it last published (its `TurnstileStatus` search
attribute, or its memo where the namespace has no search attributes): it
publishes on entering and on leaving an approval wait, so "parked" is true
while a call of it waits for a reviewer. Whatever it says, the holder itself
decides whether a steer applies (workflows/steer_signal.py): a decision that
came first wins and the steer is ignored.
"""

from __future__ import annotations

import logging

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from turnstile.engine import search_keys
from turnstile.engine.contract import Handlers, SteerSignal, TurnPhase
from turnstile.runtime.client import workflow_gone
from turnstile.stores.lock import Holder

log = logging.getLogger(__name__)



def _handle(client: Client, holder: Holder) -> WorkflowHandle[object, object]:
    # A holder known by its chain holds the lock with whichever run of it is
    # current (a reset run keeps the lock): signal the current run.
    run_id = holder.run_id if holder.chain is None else None
    return client.get_workflow_handle(holder.workflow_id, run_id=run_id)


async def holder_awaits_approval(client: Client, holder: Holder) -> bool:
    """Is the turn holding the lock parked on an approval now? False when
    Temporal cannot say (the new turn then queues, as before)."""
    try:
        desc = await _handle(client, holder).describe()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            log.warning("could not ask Temporal about lock holder %s: %s",
                        holder.workflow_id, exc)
        return False
    status = desc.typed_search_attributes.get(search_keys.STATUS)
    if status is None:  # no search attributes in this namespace: the memo has it
        status = await desc.memo_value("turnstile_status", default=None)
    return bool(status == TurnPhase.AWAITING_APPROVAL)


async def steer(client: Client, holder: Holder, signal: SteerSignal) -> bool:
    """Send the `steer` signal; False when the holder no longer runs (its
    lock is then free or taken over on the next attempt)."""
    try:
        await _handle(client, holder).signal(Handlers.STEER, signal)
    except RPCError as exc:
        if workflow_gone(exc):
            return False
        raise
    return True
