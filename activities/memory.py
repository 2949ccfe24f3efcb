"""Activities of chat memory: load (ownership, lock, snapshot), append, release."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.runtime import Runtime, application_error, turn_workflow_id
from turnstile.engine.activity_io import (
    APPEND_MESSAGES,
    LOAD_MEMORY,
    RELEASE_CONVERSATION,
    AppendMessagesInput,
    LoadMemoryInput,
    MemorySnapshot,
)
from turnstile.engine.errors import (
    ConversationBusy,
    ConversationOwnershipError,
    DatabaseUnavailable,
    MemoryConflictError,
)
from turnstile.stores.lock import ConversationLocks, Holder


class MemoryActivities:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @activity.defn(name=LOAD_MEMORY)
    async def load_memory(self, req: LoadMemoryInput) -> MemorySnapshot:
        """Step 1 when the conversation was busy at begin_turn: retried by the
        server (ConversationBusy) until the turn holding it ends."""
        try:
            return await self.load(req.conversation_id, req.user_id)
        except ConversationOwnershipError as exc:
            raise application_error(exc, non_retryable=True) from exc
        except (DatabaseUnavailable, ConversationBusy) as exc:
            raise application_error(exc, non_retryable=False) from exc

    async def load(self, conv: str, user_id: str) -> MemorySnapshot:
        """Step 1: check ownership, take the conversation's lock, read a snapshot.
        Raises ConversationOwnershipError, ConversationBusy, DatabaseUnavailable."""
        memory = self.rt.memory
        await asyncio.to_thread(memory.check_owner, conv, user_id)
        await self._lock(conv)
        # Holding the lock: calls of ended turns left without a result get one.
        repairs = await asyncio.to_thread(self.rt.journal.repair_orphans, conv,
                                          turn_workflow_id())
        snapshot = await asyncio.to_thread(memory.snapshot, conv, user_id)
        snapshot.repaired = [f"{r.call_id} ({r.tool_name}) of turn {r.workflow_id}: "
                             f"{r.outcome.value}" for r in repairs]
        return snapshot

    async def _lock(self, conversation_id: str) -> None:
        info = activity.info()
        me = Holder(info.workflow_id or "", info.workflow_run_id or "")
        locks = ConversationLocks(self.rt.db)
        holder = await asyncio.to_thread(locks.acquire, conversation_id, me)
        if holder is None:
            return
        if await _gone(holder) and await asyncio.to_thread(
                locks.take_over, conversation_id, holder, me):
            activity.logger.warning("took over the lock of %s from ended turn %s",
                                    conversation_id, holder.workflow_id)
            return
        raise ConversationBusy(f"conversation {conversation_id!r} is in use by turn "
                               f"{holder.workflow_id}; this turn waits until it ends")

    @activity.defn(name=RELEASE_CONVERSATION)
    def release_conversation(self, req: LoadMemoryInput) -> None:
        info = activity.info()
        ConversationLocks(self.rt.db).release(
            req.conversation_id, Holder(info.workflow_id or "", info.workflow_run_id or ""))

    @activity.defn(name=APPEND_MESSAGES)
    def append_messages(self, req: AppendMessagesInput) -> None:
        """Messages the workflow wrote itself, with the audit rows and approval
        decisions of the calls it settled: one transaction (the call journal's
        rule: a settled call's facts are written together or not at all)."""
        wf_id, chain = turn_workflow_id(), req.execution_chain
        try:
            with self.rt.db.connect() as conn:
                self.rt.memory.append_in(conn, req.conversation_id, req.start_seq,
                                         req.messages, wf_id, chain or None)
                for e in req.audit:
                    self.rt.audit.settled(
                        workflow_id=wf_id, call_id=e.call_id,
                        conversation_id=req.conversation_id, user_id=req.user_id,
                        tool_name=e.tool_name, arguments=e.arguments, status=e.status,
                        error=e.error, chain=chain, conn=conn)
                for d in req.decisions:
                    self.rt.audit.decision(workflow_id=wf_id, tool_name=d.tool_name,
                                           tool_call_id=d.tool_call_id, approved=d.approved,
                                           reviewer=d.reviewer, note=d.note,
                                           decided_at=d.decided_at, chain=chain, conn=conn)
        except MemoryConflictError as exc:
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc


async def _gone(holder: Holder) -> bool:
    """Has the turn holding a lock ended without releasing it?"""
    try:
        desc = await activity.client().get_workflow_handle(
            holder.workflow_id, run_id=holder.run_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return True
        raise
    return desc.status != WorkflowExecutionStatus.RUNNING
