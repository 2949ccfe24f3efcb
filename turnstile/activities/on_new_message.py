"""A new turn meets its conversation held by a turn parked on an approval
(docs/steering.md): the service's `on_new_message` policy, applied by the
new turn's lock attempt (begin_turn, then every attempt of load_memory).

- "queue": wait for the lock, as any busy conversation (the status says
  "queued behind turn X, waiting for an approval");
- "refuse": the new turn ends `refused` (NewMessageRefused), holding nothing;
- "steer": signal the holder `steer` (workflows/steer_signal.py rejects its
  waiting calls, "the user sent a new message", and ends it `steered`), then
  wait here for its release and take the lock, so the new turn runs at once.

The signal is safe to send again (a retried attempt does): the holder
applies the first and ignores the rest, and it ignores a steer when no call
of it waits any more (a reviewer decided first; it is ending). If the lock
is not free within STEER_WAIT_SECONDS, the attempt says busy and the next
one looks again.
"""

from __future__ import annotations

import asyncio
import time

from temporalio import activity
from temporalio.client import Client

from turnstile.engine.contract import SteerSignal
from turnstile.engine.errors import ConversationBusy, NewMessageRefused
from turnstile.runtime.steering import steer
from turnstile.stores.lock import ConversationLocks, Holder

WAITING_FOR_APPROVAL = "waiting for an approval"
# How long one lock attempt waits for a steered holder to let go: the holder
# records its rejected calls and releases in one or two workflow tasks.
STEER_WAIT_SECONDS = 10.0
POLL_SECONDS = 0.05


async def new_message(client: Client, locks: ConversationLocks, conversation_id: str,
                      holder: Holder, me: Holder, user_id: str, policy: str) -> bool:
    """The holder waits for an approval: True when this turn now holds the
    lock (it steered the holder); False to queue. Raises NewMessageRefused,
    and ConversationBusy when another new turn took the lock first."""
    if policy == "refuse":
        raise NewMessageRefused(
            f"conversation {conversation_id!r} waits for an approval in turn "
            f"{holder.workflow_id}; this service refuses a new message meanwhile "
            "(on_new_message='refuse'): decide the pending call first")
    if policy != "steer":
        return False
    if not await steer(client, holder, SteerSignal(turn_id=me.workflow_id, user_id=user_id)):
        return False  # it ended: the next attempt takes the lock over
    activity.logger.info("steered turn %s of conversation %s: waiting for its release",
                         holder.workflow_id, conversation_id)
    deadline = time.monotonic() + STEER_WAIT_SECONDS
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL_SECONDS)
        now = await locks.db.call(locks.acquire, conversation_id, me)
        if now is None:
            return True
        if now.workflow_id != holder.workflow_id:  # another new turn was first: behind it
            queued = f"queued behind turn {now.workflow_id}"
            raise ConversationBusy(f"conversation {conversation_id!r} is in use by turn "
                                   f"{now.workflow_id}; this turn waits until it ends", queued)
    return False
