"""How a turn ends (docs/pipeline.md, step 17): stopped with a typed error
(the saga undoes completed effects), cancelled (every open call gets a
result, then the saga), or completed; then memory is settled, the
conversation released, the "turn completed" event delivered and the result
returned. A mixin of `AgentTurn`. Deterministic code only.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io
    from turnstile.engine.contract import TurnErrorInfo, TurnInput, TurnResult, TurnStatus
    from turnstile.engine.errors import TurnCancelled
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.versions import CANCEL_PUBLISHED
    from turnstile.workflows import turn_metrics as metrics
    from turnstile.workflows.model_loop import ModelLoop
    from turnstile.workflows.pipeline_steps import PipelineSteps
    from turnstile.workflows.saga import roll_back
    from turnstile.workflows.state import TurnState, TurnStopped
    from turnstile.workflows.tool_round import ToolRound


class TurnEnding:
    s: TurnState
    spec: ServiceSpec
    steps: PipelineSteps | None
    loop: ModelLoop | None
    locked: bool  # holds the conversation's lock (turnstile.stores.lock)

    async def _stopped(self, turn: TurnInput, stop: TurnStopped) -> TurnResult:
        """The turn stopped with a status and a typed error: undo, then end."""
        error = TurnErrorInfo(type=stop.error_type, message=str(stop), step=stop.step,
                              exception=stop.exception)
        status = stop.status
        if self.s.compensable and stop.compensate:
            rolled = await roll_back(self.s, self.spec, turn, error, stop.call_id)
            # A more specific end (moderated) stays visible unless an undo failed.
            if status is TurnStatus.FAILED or rolled is TurnStatus.COMPENSATION_FAILED:
                status = rolled
        return await self._result(turn, status, stop.answer, error)

    async def _cancelled(self, turn: TurnInput) -> None:
        """`temporal workflow cancel`: every call gets a result, what was done
        is undone; the caller re-raises, so the turn ends as Canceled."""
        s = self.s
        round_ = self.loop.round if self.loop is not None else None
        if round_ is not None:
            try:
                await self._settle_cancelled(round_)
            except TurnStopped as stop:  # the next memory load repairs what is missing
                s.event("record_failed", str(stop))
        if s.compensable:
            error = TurnErrorInfo(type=TurnCancelled.error_type,
                                  message="the turn was cancelled")
            await roll_back(s, self.spec, turn, error, None)
        cancelled = s.machine.cancel(s.round_trips)  # nothing waits any more
        # The search attributes say the turn ended cancelled, with no approval
        # pending (a turn cancelled while it waited kept `awaiting_approval`
        # and its count). A turn cancelled before this rule replays without.
        if workflow.patched(CANCEL_PUBLISHED):
            await s.enter(cancelled)
        assert self.steps is not None
        self.steps.events.turn_completed(None, TurnStatus.CANCELLED)
        metrics.turn_ended(turn.service, TurnStatus.CANCELLED)
        await self._release(turn)
        await self.steps.events.delivered()

    async def _settle_cancelled(self, round_: ToolRound) -> None:
        """Calls still open when the cancel arrived: those awaiting approval (or
        not yet run) are recorded as not run; those running may or may not have
        taken effect: the compensable ones join the rollback, the others are
        recorded as interrupted."""
        for call, rec in round_.settle_cancelled():
            tool = self.spec.tool(call.name)
            if tool is not None and tool.compensation:
                self.s.compensable.append((call, rec))
        await round_.write_cancelled()

    async def _release(self, turn: TurnInput) -> None:
        """Store what no model call took, audit the decisions refused since the
        last round, then let the conversation's next turn in."""
        try:
            await self.s.flush()  # e.g. the user message of a turn stopped before its model call
        except TurnStopped as stop:
            self.s.event("record_failed", str(stop))
        if not workflow.all_handlers_finished():  # e.g. a refusal being audited
            await workflow.wait_condition(workflow.all_handlers_finished)
        refusals = self.s.take_refusals()
        if refusals:  # e.g. a refused signal, then a cancel before the round ended
            try:
                await self.s.append([], audit=refusals)
            except TurnStopped as stop:
                self.s.event("record_failed", str(stop))
        assert self.steps is not None
        events = self.steps.events
        if self.locked:
            taken = events.take()  # "turn completed" rides with the release
            # A steered turn's new turns signal it while it ends: as an activity,
            # its release is in history before the final workflow task, which a
            # signal arriving meanwhile fails and retries (a local activity would
            # be run again, after the new turn took the conversation).
            release = self.s.activity if self.s.steered is not None else self.s.local
            try:
                await release(
                    io.release_conversation, io.ReleaseInput(
                        conversation_id=turn.conversation_id, user_id=turn.user_id,
                        execution_chain=self.s.chain, next_seq=self.s.seq, events=taken),
                    "release_conversation", TurnStatus.FAILED)
                self.locked = False
            except TurnStopped as stop:
                self.locked = False  # asked once; an unexpected error ends and asks again
                # The turn still ends with its status; the next turn of the
                # conversation takes over the lock of an ended turn.
                self.s.event("release_failed", str(stop))
                events.pending[:0] = taken  # not delivered: sent on their own
        events.publish_pending()

    async def _result(self, turn: TurnInput, status: TurnStatus, answer: Any,
                      error: TurnErrorInfo | None) -> TurnResult:
        """17. "turn completed" event, return."""
        s = self.s
        ended = s.machine.end(status, s.round_trips)  # nothing waits (the attributes say 0)
        result = TurnResult(
            status=status, answer=answer, round_trips=s.round_trips, tool_calls=s.calls,
            error=error, workflow_id=workflow.info().workflow_id,
            conversation_id=turn.conversation_id, service=turn.service, provider=s.provider,
            usage=s.usage)
        assert self.steps is not None
        metrics.turn_ended(turn.service, status.value)
        # Delivered while the conversation is released.
        self.steps.events.turn_completed(result, status)
        await self._release(turn)
        await s.enter(ended)  # once the conversation is released
        await self.steps.events.delivered()
        return result
