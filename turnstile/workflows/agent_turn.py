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
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    # Deterministic modules (the engine's models and rules, and the workflow's
    # own helpers): passed through so the sandbox does not re-import them, and
    # pydantic with them, on every workflow task.
    from pydantic import ValidationError

    from turnstile.engine import activity_io as io
    from turnstile.engine.contract import (
        WORKFLOW_TYPE,
        TurnErrorInfo,
        TurnInput,
        TurnResult,
        TurnStatus,
    )
    from turnstile.engine.errors import InvalidTurnInput, TurnstileError, UnexpectedError
    from turnstile.engine.messages import ChatMessage
    from turnstile.engine.safe_text import safe_text
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.turn_input_rules import turn_input_problem
    from turnstile.engine.versions import (
        QUEUED_VISIBLE,
        TURN_INPUT_DOOR,
        UNEXPECTED_ENDS_TURN,
        Revision,
    )
    from turnstile.workflows import turn_metrics as metrics
    from turnstile.workflows.approval_handlers import ApprovalHandlers
    from turnstile.workflows.decisions import Decisions
    from turnstile.workflows.model_loop import ModelLoop
    from turnstile.workflows.pipeline_steps import PipelineSteps
    from turnstile.workflows.state import TurnState, TurnStopped
    from turnstile.workflows.steer_signal import Steering
    from turnstile.workflows.turn_end import TurnEnding


# Every exception that escapes the turn's own code ends the turn `failed`
# with `UnexpectedError` (AgentTurn.run, _unexpected): released and repaired
# like any failed turn. What escapes elsewhere — a signal or update handler,
# a turn replaying along a path it took before that rule — meets these, the
# exceptions that fail the turn's workflow instead of its workflow task
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
class AgentTurn(ApprovalHandlers, Steering, TurnEnding):
    """The pipeline's order (docs/pipeline.md); its queries, signals and update
    are ApprovalHandlers', the `steer` signal Steering's, its endings TurnEnding's."""

    def __init__(self) -> None:
        self.s = TurnState()
        self.spec = ServiceSpec(name="")  # replaced by begin_turn
        self.steps: PipelineSteps | None = None
        self.loop: ModelLoop | None = None  # steps 12-14, once steps 2-9 are done
        self.locked = False  # holds the conversation's lock (turnstile.stores.lock)
        self.decisions = Decisions(self.s, lambda: self.spec)

    @workflow.run
    async def run(self, raw: RawValue) -> TurnResult:
        # The input arrives raw and is read here, not by the SDK: a payload
        # that does not decode into a TurnInput (a wrong type, JSON nested past
        # the decoder's limit) is refused by the door like any other input
        # that breaks a rule, instead of failing the workflow with the
        # decoder's message.
        s = self.s
        try:
            turn = workflow.payload_converter().from_payload(raw.payload, TurnInput)
        except Exception as err:  # not JSON, not a TurnInput, nested past the decoder
            if not workflow.patched(TURN_INPUT_DOOR):
                raise  # begun before the door read its own input: failed as it did
            return self._refused_at_door(TurnInput.model_construct(
                conversation_id="", user_id="", message=""), _unreadable(err))
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
            return await self._turn(turn)
        except Exception as err:  # every exception (CancelledError is not one): _unexpected
            stop = self._unexpected(err)
        try:
            return await self._stopped(turn, stop)
        except Exception as again:  # the ending itself broke
            # Ending the turn failed too: fail the workflow (not its task), so
            # the turn does not retry forever; the next turn of the
            # conversation takes over the lock of an ended turn and its memory
            # load repairs what this one left open.
            raise ApplicationError(
                f"{stop}; ending the turn then raised {type(again).__name__}: "
                f"{safe_text(str(again))[:300]}", type=UnexpectedError.error_type,
                non_retryable=True) from None

    async def _turn(self, turn: TurnInput) -> TurnResult:
        try:
            answer = await self._pipeline(turn)
        except TurnStopped as stop:
            return await self._stopped(turn, stop)
        except asyncio.CancelledError:
            await self._cancelled(turn)
            raise
        return await self._result(turn, TurnStatus.COMPLETED, answer, None)

    def _unexpected(self, err: Exception) -> TurnStopped:
        """An exception nothing in the turn handles: the turn stops `failed`
        with `UnexpectedError`, naming the step and the exception's class, and
        ends as any failed turn does (the saga undoes, memory is settled, the
        conversation released) — instead of failing its workflow task, which
        Temporal retries forever with the same history and the same code, so
        it fails the same way while the turn holds its conversation.

        Except a nondeterminism error: the worker's code does not match the
        turn's history (an incompatible deploy). Ending the turn would record
        the wrong code's decision for good; kept retrying, the turn goes on
        from where it was once a corrected worker is deployed."""
        if isinstance(err, workflow.NondeterminismError):
            raise err
        # A turn that failed this way before this rule existed (its workflow
        # failed, FAILS_THE_TURN) replays along the path it took.
        if not workflow.patched(UNEXPECTED_ENDS_TURN):
            raise err
        step = str(self.s.step)
        exception = type(err).__name__
        error = UnexpectedError(f"step {step} raised {exception}: "
                                f"{safe_text(str(err))[:300]}")
        workflow.logger.error("turn stopped by an unexpected %s in step %s", exception, step,
                              exc_info=err)
        stop = TurnStopped(TurnStatus.FAILED, error)
        stop.step, stop.exception = step, exception
        return stop

    def _refused_at_door(self, turn: TurnInput, problem: str) -> TurnResult:
        """The input breaks a rule of the door (turnstile.engine.turn_input_rules):
        refused before the turn holds anything — no lock, no row, no activity."""
        self.s.machine.refuse(problem)
        metrics.turn_ended("", TurnStatus.REFUSED.value)
        return TurnResult(
            status=TurnStatus.REFUSED, workflow_id=workflow.info().workflow_id, tool_calls=[],
            error=TurnErrorInfo(type=InvalidTurnInput.error_type, message=problem),
            conversation_id=safe_text(turn.conversation_id), service=safe_text(turn.service))

    async def _begin(self, turn: TurnInput) -> tuple[PipelineSteps, io.MemorySnapshot]:
        """1. load chat memory (a snapshot: where to write next), with the
        service's spec as this worker runs it: one local activity."""
        s = self.s
        s.machine.begin()
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
            queued = bool(begun.queued_behind) and workflow.patched(QUEUED_VISIBLE)
            if queued:
                await self._queued(turn, spec, begun.queued_behind)
            memory = await s.activity(
                io.load_memory, io.LoadMemoryInput(conversation_id=turn.conversation_id,
                                                   user_id=turn.user_id,
                                                   execution_chain=s.chain,
                                                   on_new_message=spec.on_new_message),
                "load_memory (waits for the conversation)", TurnStatus.REFUSED)
            if queued:
                s.machine.take_conversation()
        if memory.steered:
            s.event("steered", f"turn {memory.steered} waited for an approval: asked it to "
                               "give way (steer), then took the conversation")
        s.tool_names = list(begun.tool_names)
        s.revision, s.begun = Revision(begun.revision), True
        s.search_attributes = spec.search_attributes
        self.spec = spec
        turn.service = spec.name  # "" named the worker's default service
        steps = self.steps = PipelineSteps(s, turn, spec)
        if begun.opened is not None and s.revision.opens_in_begin_turn:
            steps.take_opened(opening, begun.opened)
        # Found by conversation, user, service at once (from revision 1).
        await s.enter(s.machine.begun(memory.message_count,
                                      findable=s.revision.findable_at_start))
        self.locked = True  # begin_turn took the conversation's lock
        s.seq = memory.next_seq
        for note in memory.repaired:  # calls an ended turn left without a result
            s.event("memory_repaired", note)
        metrics.repairs(len(memory.repaired))
        metrics.turn_started(spec.name)
        return steps, memory

    async def _queued(self, turn: TurnInput, spec: ServiceSpec, behind: str) -> None:
        """Waiting for the conversation, visibly: step `queued`, the status
        query's `queued_behind`, the search attribute (docs/steering.md)."""
        s = self.s
        queued = s.machine.queue(behind)
        s.search_attributes = spec.search_attributes
        turn.service = spec.name
        await s.enter(queued)

    async def _pipeline(self, turn: TurnInput) -> Any:
        s = self.s
        steps, memory = await self._begin(turn)  # 1.
        prepared = await steps.prepare()  # 2-9.
        # 10. write memory: the user message is stored before the model is
        # called, by the model-call activity itself (ModelCallInput.prelude).
        new = []
        if prepared.system and prepared.system != memory.system_prompt:
            new.append(ChatMessage(role="system", content=prepared.system))
        new.append(prepared.user.stored(self.spec.pipeline.policy))
        s.defer(new)
        steps.start_moderation(prepared.user)  # 11. moderation, concurrently with the model
        loop = self.loop = ModelLoop(s, turn, self.spec, steps, prepared)
        try:
            answer = await loop.run()  # 12-14. tools, model, round trips
            await steps.check_moderation(wait=True)  # 11. checked before the answer
            while True:
                # 15. output guardrails, 16. parse to the return type
                reask, typed = await steps.answer.checked(answer)
                if reask is None:
                    return typed
                await steps.answer.reask(reask)
                answer = await loop.run()
        finally:
            steps.cancel_moderation()


def _unreadable(err: Exception) -> str:
    """The door's reason for an input that does not decode into a TurnInput."""
    if isinstance(err, ValidationError) and err.error_count():
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the input"
        text = f"{where}: {first.get('msg', '')}"
    else:
        text = f"{type(err).__name__}: {err}"
    return safe_text(text)[:300] + " (the input does not read as a TurnInput)"
