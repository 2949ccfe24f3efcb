"""Activities of chat memory: load (ownership, lock, snapshot), append, release.

A run of a turn that another run of it preceded (a reset run, a workflow
retry) takes that run's place: it keeps the turn's lock, and what the
earlier run wrote after the reset point is superseded (turnstile.stores.runs;
activities.run_writes confirms the run is current first)."""

from __future__ import annotations

import logging

from temporalio import activity

from turnstile.activities.on_new_message import WAITING_FOR_APPROVAL, new_message
from turnstile.activities.pipeline import deliver
from turnstile.activities.run_writes import as_current_run, holder_gone, run_is_current
from turnstile.activities.runtime import Activities, application_error, turn_workflow_id
from turnstile.engine.activity_io import (
    APPEND_MESSAGES,
    LOAD_MEMORY,
    RELEASE_CONVERSATION,
    AppendMessagesInput,
    LoadMemoryInput,
    MemorySnapshot,
    ReleaseInput,
)
from turnstile.engine.errors import (
    ConversationBusy,
    ConversationOwnershipError,
    DatabaseUnavailable,
    MemoryConflictError,
    NewMessageRefused,
    ResetConflict,
    RunSuperseded,
)
from turnstile.runtime.steering import holder_awaits_approval
from turnstile.stores import runs, superseded
from turnstile.stores.lock import ConversationLocks, Holder

log = logging.getLogger("turnstile.activities")

# Failures no retry can fix: the turn ends with their type.
REFUSED = (ConversationOwnershipError, MemoryConflictError, ResetConflict, RunSuperseded,
           NewMessageRefused)


class MemoryActivities(Activities):
    @activity.defn(name=LOAD_MEMORY)
    async def load_memory(self, req: LoadMemoryInput) -> MemorySnapshot:
        """Step 1 when the conversation was busy at begin_turn: retried by the
        server (ConversationBusy) until the turn holding it ends."""
        try:
            return await self.load(req.conversation_id, req.user_id, req.execution_chain,
                                   req.on_new_message)
        except REFUSED as exc:
            raise application_error(exc, non_retryable=True) from exc
        except (DatabaseUnavailable, ConversationBusy) as exc:
            raise application_error(exc, non_retryable=False) from exc

    async def load(self, conv: str, user_id: str, chain: str = "",
                   on_new_message: str = "queue") -> MemorySnapshot:
        """Step 1: check ownership, take the conversation's lock, read a snapshot.
        A run that starts its turn over (reset to the turn's start, a workflow
        retry) supersedes everything an earlier run of its turn wrote.
        Raises ConversationOwnershipError, ConversationBusy, DatabaseUnavailable,
        ResetConflict, RunSuperseded, MemoryConflictError, NewMessageRefused.
        `on_new_message`: what to do when the holder waits for an approval
        (docs/steering.md)."""
        wf_id = turn_workflow_id()
        steered = await self._lock(conv, user_id, chain, on_new_message)
        if not chain:
            snapshot = await self.rt.db.call(self._open, conv, user_id, wf_id, chain, None)
            snapshot.steered = steered
            return snapshot
        try:
            # One thread hop for what follows the lock (each step its own
            # transaction, as before): nothing of this turn is in this run's
            # history yet, so the claim's horizon is 0.
            snapshot = await as_current_run(self.rt.db,
                chain, lambda w: self._open(conv, user_id, wf_id, chain, w))
            snapshot.steered = steered
            return snapshot
        except ResetConflict:  # refused: the conversation is not this run's to hold
            info = activity.info()
            await self.rt.db.call(ConversationLocks(self.rt.db).release, conv, Holder(
                info.workflow_id or "", info.workflow_run_id or ""))
            raise

    def _open(self, conv: str, user_id: str, wf_id: str, chain: str,
              w: runs.Writer | None) -> MemorySnapshot:
        """Holding the lock: claim the conversation for this run (`w`), record
        what other turns' reset runs left of superseded calls, give calls
        without a result one, and read the snapshot."""
        with self.rt.db.connect() as conn:  # one transaction
            if w is not None:
                runs.write(self.rt.db, conv, 0, [], w, 0, conn)
            for sc, effect in self.rt.journal.settle_others_superseded(conn, conv, wf_id, chain):
                _flag(conv, sc, effect)
            repairs = self.rt.journal.repair_orphans(conv, wf_id, conn)
            snapshot = self.rt.memory.snapshot(conv, user_id, conn)
        snapshot.repaired = [f"{r.call_id} ({r.tool_name}) of turn {r.workflow_id}: "
                             f"{r.outcome.value}" for r in repairs]
        return snapshot

    def _owner_and_lock(self, conversation_id: str, user_id: str, locks: ConversationLocks,
                        me: Holder) -> Holder | None:
        self.rt.memory.check_owner(conversation_id, user_id)
        return locks.acquire(conversation_id, me)

    async def _lock(self, conversation_id: str, user_id: str, chain: str,
                    on_new_message: str = "queue") -> str:
        """Check the conversation is the user's, then take its lock. Returns
        the turn this one steered to take it ("" when none)."""
        info = activity.info()
        me = Holder(info.workflow_id or "", info.workflow_run_id or "", chain or None)
        locks = ConversationLocks(self.rt.db)
        holder = await self.rt.db.call(self._owner_and_lock, conversation_id, user_id,
                                       locks, me)
        if holder is None:
            return ""
        client = activity.client()
        if holder.same_turn(me):
            # An earlier run of this turn (a reset replaced it): the turn keeps
            # its lock, and this run takes its place if it is the current one.
            if not await run_is_current(client, me.workflow_id, me.run_id):
                raise RunSuperseded(f"run {me.run_id} of turn {me.workflow_id} is no longer "
                                    "its workflow's current run")
            if await self.rt.db.call(locks.take_over, conversation_id, holder, me):
                return ""
        elif await holder_gone(client, holder) and await self.rt.db.call(
                locks.take_over, conversation_id, holder, me):
            activity.logger.warning("took over the lock of %s from ended turn %s",
                                    conversation_id, holder.workflow_id)
            return ""
        elif await holder_awaits_approval(client, holder):
            if await new_message(client, locks, conversation_id, holder, me, user_id,
                                 on_new_message):
                return holder.workflow_id
            queued = f"queued behind turn {holder.workflow_id}, {WAITING_FOR_APPROVAL}"
            raise ConversationBusy(f"conversation {conversation_id!r}: {queued}", queued)
        queued = f"queued behind turn {holder.workflow_id}"
        raise ConversationBusy(f"conversation {conversation_id!r} is in use by turn "
                               f"{holder.workflow_id}; this turn waits until it ends", queued)

    @activity.defn(name=RELEASE_CONVERSATION)
    async def release_conversation(self, req: ReleaseInput) -> None:
        """The turn's run ends: what an earlier run of the turn wrote beyond
        this run's last slot is superseded, what became of the superseded
        calls is recorded, then the lock is let go."""
        await self._release(req)
        if req.events:  # the "turn completed" event, once the conversation is free
            await deliver(self.rt, req.events)

    async def _release(self, req: ReleaseInput) -> None:
        info = activity.info()
        conv = req.conversation_id
        holder = Holder(info.workflow_id or "", info.workflow_run_id or "")
        locks = ConversationLocks(self.rt.db)
        if req.execution_chain:
            try:
                await as_current_run(self.rt.db, req.execution_chain,
                                     lambda w: self._sweep(req, w, locks, holder))
                return
            except (MemoryConflictError, ResetConflict, RunSuperseded) as exc:
                # Not this run's conversation to tidy; the turn still ends.
                log.warning("release of %s by %s: %s", conv, info.workflow_id, exc)
            except DatabaseUnavailable as exc:
                raise application_error(exc, non_retryable=False) from exc
        await self.rt.db.call(locks.release, conv, holder)

    def _sweep(self, req: ReleaseInput, w: runs.Writer, locks: ConversationLocks,
               holder: Holder) -> None:
        """Supersede, settle, then let go of the lock (one thread hop, one
        transaction)."""
        with self.rt.db.connect() as conn:
            runs.write(self.rt.db, req.conversation_id, req.next_seq or 0, [], w, req.next_seq,
                       conn)
            for sc, effect in self.rt.journal.settle_own_superseded(conn, req.conversation_id,
                                                                    w):
                _flag(req.conversation_id, sc, effect)
            locks.release(req.conversation_id, holder, conn)

    @activity.defn(name=APPEND_MESSAGES)
    async def append_messages(self, req: AppendMessagesInput) -> None:
        """Messages the workflow wrote itself, with the audit rows and approval
        decisions of the calls it settled: one transaction (the call journal's
        rule: a settled call's facts are written together or not at all)."""
        try:
            if req.execution_chain:
                await as_current_run(self.rt.db, req.execution_chain,
                                     lambda w: self._append(req, w))
            else:
                await self.rt.db.call(self._append, req, None)
        except REFUSED as exc:
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc

    def _append(self, req: AppendMessagesInput, w: runs.Writer | None) -> None:
        wf_id, chain = turn_workflow_id(), req.execution_chain
        with self.rt.db.connect() as conn:
            if w is not None:
                runs.claim(conn, req.conversation_id, w,
                           range(req.start_seq, req.start_seq + len(req.messages)))
            self.rt.memory.append_in(conn, req.conversation_id, req.start_seq,
                                     req.messages, wf_id, chain or None,
                                     run_id=w.run_id if w is not None else None)
            self.rt.journal.settled(conn, wf_id, chain, req.conversation_id, req.user_id,
                                    req.audit, req.decisions)


def _flag(conv: str, sc: superseded.SupersededCall, effect: superseded.Effect) -> None:
    """An effect of a superseded call that remains (or may) is a warning."""
    if effect in (superseded.Effect.REMAINS, superseded.Effect.UNKNOWN):
        log.warning("conversation %s: call %s (%s) of turn %s was superseded by reset run "
                    "%s: %s", conv, sc.call.id, sc.call.name, sc.workflow_id,
                    sc.superseded_by, superseded.DETAIL[effect])
