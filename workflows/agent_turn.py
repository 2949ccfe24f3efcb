"""`AgentTurn`: one user message through the turn pipeline (docs/pipeline.md).

Deterministic code only. Everything that touches the world — memory, the
model, tools — is an activity named in `turnstile.engine.activity_io`; the workflow
holds references (memory slots, call ids) and bounded previews, never the
conversation, so the bytes a turn adds to history do not grow with the
conversation's length.

The lean turn (version 2, `turnstile.engine.versions.TURN_VERSION`): every model call
and every tool call is its own activity; the bookkeeping around them is local
activities (begin_turn, memory writes the workflow owes, release), the
messages of step 10 are written by the first model call, and memo and search
attributes change on transitions only. A plain turn is about 30 history events.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    # Deterministic modules (the engine's models and rules, and the workflow's
    # own helpers): passed through so the sandbox does not re-import them, and
    # pydantic with them, on every workflow task.
    from pydantic import ValidationError

    from turnstile.engine import activity_io as io, endings
    from turnstile.engine.breakers import Breakers
    from turnstile.engine.contract import (
        WORKFLOW_TYPE,
        ApprovalDecision,
        ApproveSignal,
        CallStatus,
        Handlers,
        PendingApproval,
        RejectSignal,
        ReviewInput,
        TurnErrorInfo,
        TurnInput,
        TurnPhase,
        TurnProgress,
        TurnResult,
        TurnStatus,
    )
    from turnstile.engine.errors import (
        AnswerTruncated,
        ContentFiltered,
        DecisionRefused,
        InvalidTurnInput,
        TurnCancelled,
        TurnstileError,
    )
    from turnstile.engine.masking import mask_text
    from turnstile.engine.messages import ChatMessage, ToolCall
    from turnstile.engine.safe_text import safe_text
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.tool_round_rules import round_stop
    from turnstile.engine.turn_input_rules import turn_input_problem
    from turnstile.engine.turn_rules import FinalAnswer, RunTools, next_step
    from turnstile.engine.versions import (
        FINDABLE_AT_START,
        OPENS_IN_BEGIN_TURN,
        TURN_INPUT_DOOR,
    )
    from workflows import turn_metrics as metrics
    from workflows.decisions import Decisions
    from workflows.pipeline_steps import PipelineSteps
    from workflows.saga import roll_back
    from workflows.state import TurnState, TurnStopped
    from workflows.tool_options import listing_options, model_options
    from workflows.tool_round import RoundWrites, ToolRound


# Exceptions that fail the turn's workflow instead of its workflow task
# (the worker's `workflow_failure_exception_types`, as pydantic-ai's Temporal
# integration declares its own). A workflow task that fails is retried
# forever with the same history and the same deterministic code, so it fails
# the same way each time while the turn holds its conversation: these are
# errors no retry can fix — our typed errors and a stop that escaped its
# handler, data that does not fit its type, text that cannot be encoded,
# nesting too deep to walk, and an assertion of the workflow's own rules.
# Not listed, on purpose: NondeterminismError (a worker running incompatible
# code must not end in-flight turns; the operator redeploys and they go on).
FAILS_THE_TURN: tuple[type[BaseException], ...] = (
    TurnstileError, TurnStopped, ValidationError, UnicodeError, RecursionError,
    AssertionError)


@workflow.defn(name=WORKFLOW_TYPE)
class AgentTurn:
    def __init__(self) -> None:
        self.s = TurnState()
        self.spec = ServiceSpec(name="")  # replaced by begin_turn
        self.steps: PipelineSteps | None = None
        self.locked = False  # holds the conversation's lock (turnstile.stores.lock)
        self.breakers: Breakers | None = None
        self.stream = False  # step 8, decided once per turn
        self.response_format: dict[str, Any] | None = None  # step 9
        self.round: ToolRound | None = None  # the tool round under way
        self.decisions = Decisions(self.s, lambda: self.spec)

    # -- queries, signals, update (docs/contract.md) ----------------------------
    @workflow.query(name=Handlers.STATUS)
    def status(self) -> TurnProgress:
        s = self.s
        return TurnProgress(step=s.step, round_trips=s.round_trips, tool_calls=s.calls,
                            pending_approvals=list(s.pending.values()),
                            refused_signals=s.refused, events=s.events)

    @workflow.query(name=Handlers.PENDING_APPROVALS)
    def pending_approvals(self) -> list[PendingApproval]:
        return list(self.s.pending.values())

    @workflow.signal(name=Handlers.APPROVE)
    def approve(self, signal: ApproveSignal) -> None:
        self.decisions.decide(signal.tool_call_id, True, signal.reviewer, signal.comment)

    @workflow.signal(name=Handlers.REJECT)
    def reject(self, signal: RejectSignal) -> None:
        self.decisions.decide(signal.tool_call_id, False, signal.reviewer, signal.reason)

    @workflow.update(name=Handlers.REVIEW)
    def review(self, decision: ReviewInput) -> ApprovalDecision:
        """The decision that took effect; refused with the reason (DecisionRefused)."""
        taken = self.decisions.decide(decision.tool_call_id, decision.approved,
                                      decision.reviewer, decision.note)
        if isinstance(taken, str):  # another decision won the race since validation
            raise ApplicationError(taken, type=DecisionRefused.error_type, non_retryable=True)
        return taken

    @review.validator
    def _validate_review(self, decision: ReviewInput) -> None:
        reason = self.decisions.refusal(decision.tool_call_id, decision.reviewer,
                                        replaying_rules=False)
        if reason:
            raise ApplicationError(reason, type=DecisionRefused.error_type, non_retryable=True)

    # -- the pipeline ------------------------------------------------------------
    @workflow.run
    async def run(self, turn: TurnInput) -> TurnResult:
        s = self.s
        s.turn = turn
        problem = turn_input_problem(turn)
        # A turn begun before the door existed replays along the path it took.
        if problem is not None and workflow.patched(TURN_INPUT_DOOR):
            return self._refused_at_door(turn, problem)
        # Keys of this turn's effects (ledger, audit, idempotency, approvals):
        # the same across reset, workflow retry and continue-as-new, new for
        # a new start of a closed workflow id (tests/test_execution_chain.py).
        s.chain = workflow.info().first_execution_run_id
        self.steps = PipelineSteps(s, turn, self.spec)
        try:
            answer = await self._pipeline(turn)
        except TurnStopped as stop:
            error = TurnErrorInfo(type=stop.error_type, message=str(stop))
            status = stop.status
            if s.compensable and stop.compensate:
                rolled = await roll_back(s, self.spec, turn, error, stop.call_id)
                # A more specific end (moderated) stays visible unless an undo failed.
                if status is TurnStatus.FAILED or rolled is TurnStatus.COMPENSATION_FAILED:
                    status = rolled
            return await self._result(turn, status, stop.answer, error)
        except asyncio.CancelledError:
            # `temporal workflow cancel`: every call gets a result, what was done
            # is undone, then the turn ends as Canceled.
            if self.round is not None:
                try:
                    await self._settle_cancelled(self.round)
                except TurnStopped as stop:  # the next memory load repairs what is missing
                    s.event("record_failed", str(stop))
            if s.compensable:
                error = TurnErrorInfo(type=TurnCancelled.error_type,
                                      message="the turn was cancelled")
                await roll_back(s, self.spec, turn, error, None)
            s.step = TurnStatus.CANCELLED  # the status query's (no command: replay-safe)
            self.steps.turn_completed(None, TurnStatus.CANCELLED)
            metrics.turn_ended(turn.service, TurnStatus.CANCELLED)
            await self._release(turn)
            await self.steps.events_delivered()
            raise
        return await self._result(turn, TurnStatus.COMPLETED, answer, None)

    def _refused_at_door(self, turn: TurnInput, problem: str) -> TurnResult:
        """The input breaks a rule of the door (turnstile.engine.turn_input_rules):
        refused before the turn holds anything — no lock, no row, no activity."""
        self.s.step = TurnStatus.REFUSED
        self.s.event("turn_refused", problem)
        metrics.turn_ended("", TurnStatus.REFUSED.value)
        return TurnResult(
            status=TurnStatus.REFUSED, workflow_id=workflow.info().workflow_id, tool_calls=[],
            error=TurnErrorInfo(type=InvalidTurnInput.error_type, message=problem),
            conversation_id=safe_text(turn.conversation_id), service=safe_text(turn.service))

    async def _pipeline(self, turn: TurnInput) -> Any:
        s = self.s
        # 1. load chat memory (a snapshot: where to write next), with the
        # service's spec as this worker runs it: one local activity.
        s.step = TurnPhase.LOAD_MEMORY
        assert self.steps is not None
        opening = self.steps.opening()  # steps 4-5 for begin_turn, if the service lets it
        begun = await s.local(
            io.begin_turn, io.BeginTurnInput(service=turn.service,
                                             conversation_id=turn.conversation_id,
                                             user_id=turn.user_id, execution_chain=s.chain,
                                             opening=opening),
            "begin turn: service, memory, lock", TurnStatus.REFUSED)
        spec, memory = begun.spec, begun.memory
        if memory is None:  # another turn holds the conversation: wait, visibly
            s.event("conversation_busy", begun.busy or "")
            memory = await s.activity(
                io.load_memory, io.LoadMemoryInput(conversation_id=turn.conversation_id,
                                                   user_id=turn.user_id,
                                                   execution_chain=s.chain),
                "load_memory (waits for the conversation)", TurnStatus.REFUSED)
        s.tool_names = list(begun.tool_names)
        s.revision, s.begun = begun.revision, True
        s.search_attributes = spec.search_attributes
        self.spec = spec
        turn.service = spec.name  # "" named the worker's default service
        steps = self.steps = PipelineSteps(s, turn, spec)
        if begun.opened is not None and s.revision >= OPENS_IN_BEGIN_TURN:
            steps.take_opened(opening, begun.opened)
        if s.revision >= FINDABLE_AT_START:  # found by conversation, user, service at once
            await s.publish()
        self.locked = True  # begin_turn took the conversation's lock
        s.seq = memory.next_seq
        s.event("load_memory", f"{memory.message_count} stored message(s)")
        for note in memory.repaired:  # calls an ended turn left without a result
            s.event("memory_repaired", note)
        metrics.repairs(len(memory.repaired))
        metrics.turn_started(spec.name)
        s.step = TurnPhase.PREPARE
        system = await steps.system_message()  # 2. system message (+ transformer)
        user = steps.user_message()  # 3. user message from its template
        # 4-5 (begin_turn ran them when it could: then nothing is scheduled here)
        steps.turn_started()  # 4. "turn started" event (delivered while the turn goes on)
        user = await steps.retrieval(user)  # 5. retrieval: the user message only
        user = steps.attachments(user)  # 6. multimodal parts
        await steps.input_guardrails(user)  # 7. input guardrails see the final message
        self.stream = steps.streaming()  # 8. streaming, once per turn
        user, self.response_format = steps.output_format(user)  # 9. output format
        steps.user = user
        # 10. write memory: the user message is stored before the model is
        # called, by the model-call activity itself (ModelCallInput.prelude).
        new = []
        if system and system != memory.system_prompt:
            new.append(ChatMessage(role="system", content=system))
        new.append(user.stored(spec.pipeline.policy))
        s.defer(new)
        steps.start_moderation(user)  # 11. moderation, concurrently with the model
        try:
            answer = await self._loop(turn, spec)  # 12-14. tools, model, round trips
            await steps.check_moderation(wait=True)  # 11. checked before the answer
            while True:
                reask = await steps.output_guardrails(answer)  # 15. output guardrails
                typed: Any = None
                if reask is None:
                    reask, typed = await steps.parse(answer)  # 16. parse to the return type
                if reask is None:
                    return typed
                await steps.reask(reask)
                answer = await self._loop(turn, spec)
        finally:
            steps.cancel_moderation()

    async def _loop(self, turn: TurnInput, spec: ServiceSpec) -> str:
        s = self.s
        # One set of breakers per turn: a re-ask (steps 15/16) does not reset them.
        breakers = self.breakers = self.breakers or Breakers(spec.loop.breakers)
        while True:
            if spec.dynamic_tools:
                await self._resolve_tools(turn, spec)
            response = await self._honest_ending(turn, spec, await self._call_model(turn, spec))
            step = next_step(response.message)
            if isinstance(step, FinalAnswer):
                s.event("answer", mask_text(step.text[:400])[:160])
                return step.text
            assert isinstance(step, RunTools)
            assert self.steps is not None
            try:
                await self.steps.check_moderation(wait=False)  # a flagged input runs no tools
            except TurnStopped as stop:
                await self._record_unrun(step.calls, str(stop))
                raise
            s.round_trips += 1
            limit = round_stop(s.round_trips, [c.name for c in step.calls], spec.loop, breakers)
            if limit is not None:
                await self._record_unrun(step.calls, str(limit))
                raise TurnStopped(TurnStatus.FAILED, limit)
            s.step = TurnPhase.TOOLS
            self.round = ToolRound(s, turn, spec, breakers)
            await self.round.run(step.calls, s.alloc(len(step.calls)))
            self.round = None

    async def _honest_ending(self, turn: TurnInput, spec: ServiceSpec,
                             response: io.ModelCallResult) -> io.ModelCallResult:
        """Only a natural stop is a complete answer (turnstile.engine.endings).
        The extra activities run only on the path that needs them."""
        ends = endings.ending(response.finish_reason)
        if ends is endings.Ending.FILTERED:
            return await self._filtered()
        if ends is not endings.Ending.LENGTH or response.message.tool_calls:
            return response  # cut tool arguments fail validation and go back to the model
        self.s.event("truncated", "answer cut at the length limit; asking to continue")
        more = await self._call_model(turn, spec, continuation=True)
        text = (response.message.content or "") + (more.message.content or "")
        ends = endings.ending(more.finish_reason)
        if ends is endings.Ending.FILTERED:
            return await self._filtered()
        if ends is endings.Ending.LENGTH:
            raise TurnStopped(TurnStatus.TRUNCATED, AnswerTruncated(endings.TRUNCATED_MESSAGE),
                              answer=text, compensate=False)
        message = ChatMessage(role="assistant", content=text)
        return more.model_copy(update={"message": message, "usage": response.usage + more.usage})

    async def _filtered(self) -> io.ModelCallResult:
        assert self.steps is not None
        self.s.event("moderation", "the provider's content filter withheld the answer")
        await self.steps.discard_answer("content_filter")
        raise TurnStopped(TurnStatus.MODERATED, ContentFiltered(endings.FILTERED_MESSAGE),
                          answer=endings.FILTERED_MESSAGE)

    async def _record_unrun(self, calls: list[ToolCall], reason: str) -> None:
        """The calls a breaker, the cap or moderation stopped still get results (memory
        never keeps a tool call without its result) and audit rows."""
        s = self.s
        base = s.alloc(len(calls))
        writes = RoundWrites()
        for i, call in enumerate(calls):
            s.finish(s.new_call(call), CallStatus.FAILED, reason)
            writes.settle(base + i, call, CallStatus.FAILED, f"not run: {reason}")
        await s.append([m for _, m in writes.messages], seq=base, audit=writes.audit)

    async def _resolve_tools(self, turn: TurnInput, spec: ServiceSpec) -> None:
        """Step 12: dynamic providers may add tools, never remove one."""
        s = self.s
        resolved = await s.activity(
            io.resolve_tools, io.ResolveToolsInput(
                conversation_id=turn.conversation_id, user_id=turn.user_id,
                service=turn.service, known=s.tool_names),
            "resolve_tools", TurnStatus.FAILED, options=listing_options())
        for note in resolved.unavailable:
            s.event("tools_unavailable", note)
        for t in resolved.added:
            if t.name not in s.tool_names:
                spec.tools.append(t)
                s.tool_names.append(t.name)
                s.event("tools_added", t.name)

    async def _call_model(self, turn: TurnInput, spec: ServiceSpec,
                          continuation: bool = False) -> io.ModelCallResult:
        s = self.s
        s.step = TurnPhase.MODEL_CALL
        prelude, prelude_seq = s.take_prelude()
        s.answer_seq = s.alloc(1)
        summary = f"model round {s.round_trips + 1}" + (" continuation" if continuation else "")
        result = await s.activity(
            io.call_model,
            io.ModelCallInput(conversation_id=turn.conversation_id, service=turn.service,
                              execution_chain=s.chain,
                              tool_names=[] if continuation else list(s.tool_names),
                              response_seq=s.answer_seq, round=s.round_trips,
                              taken_call_ids=[c.id for c in s.calls], stream=self.stream,
                              response_format=self.response_format, window=spec.memory,
                              continuation=continuation, prelude=prelude,
                              prelude_seq=prelude_seq, user_id=turn.user_id,
                              known_policies=[t.name for t in spec.tools]),
            summary, TurnStatus.FAILED, options=model_options(spec.loop))
        for t in result.tools:  # policies of tools this turn calls for the first time
            if spec.tool(t.name) is None:
                spec.tools.append(t)
        s.usage = s.usage + result.usage
        s.provider = result.provider
        calls = ", ".join(c.name for c in result.message.tool_calls)
        s.event("model_call", f"asked for {calls}" if calls else "answered")
        return result

    # -- saga (workflows/saga.py) ----------------------------------------------------
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
        refusals = self.s.take_refusals()
        if refusals:  # e.g. a refused signal, then a cancel before the round ended
            try:
                await self.s.append([], audit=refusals)
            except TurnStopped as stop:
                self.s.event("record_failed", str(stop))
        assert self.steps is not None
        if self.locked:
            self.locked = False
            events = self.steps.take_events()  # "turn completed" rides with the release
            try:
                await self.s.local(
                    io.release_conversation, io.ReleaseInput(
                        conversation_id=turn.conversation_id, user_id=turn.user_id,
                        execution_chain=self.s.chain, next_seq=self.s.seq, events=events),
                    "release_conversation", TurnStatus.FAILED)
            except TurnStopped as stop:
                # The turn still ends with its status; the next turn of the
                # conversation takes over the lock of an ended turn.
                self.s.event("release_failed", str(stop))
                self.steps.pending[:0] = events  # not delivered: sent on their own
        self.steps.publish_pending()

    async def _result(self, turn: TurnInput, status: TurnStatus, answer: Any,
                      error: TurnErrorInfo | None) -> TurnResult:
        """17. "turn completed" event, return."""
        s = self.s
        s.step = status
        s.event("turn_completed", f"{status.value}, {s.round_trips} round trip(s)")
        result = TurnResult(
            status=status, answer=answer, round_trips=s.round_trips, tool_calls=s.calls,
            error=error, workflow_id=workflow.info().workflow_id,
            conversation_id=turn.conversation_id, service=turn.service, provider=s.provider,
            usage=s.usage)
        assert self.steps is not None
        metrics.turn_ended(turn.service, status.value)
        self.steps.turn_completed(result, status)  # delivered while the conversation is released
        await self._release(turn)
        await s.publish()
        await self.steps.events_delivered()
        return result
