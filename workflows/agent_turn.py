"""`AgentTurn`: one user message through the turn pipeline (design.md §1).

Deterministic code only. Everything that touches the world — memory, the
model, tools — is an activity named in `turnstile.activity_io`; the workflow
holds references (memory slots, call ids) and bounded previews, never the
conversation, so the bytes a turn adds to history do not grow with the
conversation's length.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    # Pure pydantic models and helpers: passed through so the sandbox does not
    # re-import pydantic on every workflow run.
    from turnstile import activity_io as io
    from turnstile import attributes as attr
    from turnstile.contract import (
        WORKFLOW_TYPE,
        ApprovalDecision,
        ApproveSignal,
        CallStatus,
        PendingApproval,
        RejectSignal,
        ToolCallRecord,
        TurnErrorInfo,
        TurnEvent,
        TurnInput,
        TurnProgress,
        TurnResult,
        TurnStatus,
    )
    from turnstile.errors import RoundTripCapExceeded, TurnstileError
    from turnstile.messages import ChatMessage, ToolCall, Usage
    from turnstile.specs import ServiceSpec, ToolSpec
    from turnstile.steps import FinalAnswer, RunTools, next_step, parsed_arguments, render_template
    from workflows.tool_options import memory_options, model_options, tool_options

MAX_EVENTS = 200


class TurnStopped(Exception):
    """Ends the turn with a status and a typed error (not a workflow failure)."""

    def __init__(self, status: TurnStatus, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error_type = status, error_type


@workflow.defn(name=WORKFLOW_TYPE)
class AgentTurn:
    def __init__(self) -> None:
        self._step = "starting"
        self._round_trips = 0
        self._calls: list[ToolCallRecord] = []
        self._events: list[TurnEvent] = []
        self._pending: dict[str, PendingApproval] = {}
        self._decisions: dict[str, ApprovalDecision] = {}
        self._refused: list[str] = []
        self._usage = Usage()
        self._provider = ""
        self._seq = 0
        self._arg_errors: dict[str, int] = {}

    # -- queries and signals (contract.md) -----------------------------------
    @workflow.query(name="status")
    def status(self) -> TurnProgress:
        return TurnProgress(
            step=self._step, round_trips=self._round_trips, tool_calls=self._calls,
            pending_approvals=list(self._pending.values()), refused_signals=self._refused,
            events=self._events,
        )

    @workflow.query(name="pending_approvals")
    def pending_approvals(self) -> list[PendingApproval]:
        return list(self._pending.values())

    @workflow.signal(name="approve")
    def approve(self, signal: ApproveSignal) -> None:
        self._decide(signal.tool_call_id, True, signal.reviewer, signal.comment)

    @workflow.signal(name="reject")
    def reject(self, signal: RejectSignal) -> None:
        self._decide(signal.tool_call_id, False, signal.reviewer, signal.reason)

    def _decide(self, call_id: str, approved: bool, reviewer: str, note: str) -> None:
        verb = "approve" if approved else "reject"
        if call_id not in self._pending or call_id in self._decisions:
            # Never silently accepted: a decision must name a call awaiting one.
            reason = f"{verb} by {reviewer!r} for {call_id!r} refused: no pending approval"
            workflow.logger.warning(reason)
            self._refused.append(reason)
            return
        self._decisions[call_id] = ApprovalDecision(
            tool_call_id=call_id, approved=approved, reviewer=reviewer, note=note,
            decided_at=workflow.now().isoformat(),
        )

    # -- the pipeline --------------------------------------------------------
    @workflow.run
    async def run(self, turn: TurnInput) -> TurnResult:
        try:
            answer = await self._pipeline(turn)
        except TurnStopped as stop:
            return self._result(turn, stop.status, None, TurnErrorInfo(
                type=stop.error_type, message=str(stop)))
        return self._result(turn, TurnStatus.COMPLETED, answer, None)

    async def _pipeline(self, turn: TurnInput) -> str:
        spec = await self._activity(io.DESCRIBE_SERVICE, io.DescribeServiceInput(
            service=turn.service), ServiceSpec, "describe_service", TurnStatus.REFUSED)
        # 1. load chat memory (a snapshot: where to write, a bounded preview)
        memory = await self._activity(io.LOAD_MEMORY, io.LoadMemoryInput(
            conversation_id=turn.conversation_id, user_id=turn.user_id),
            io.MemorySnapshot, "load_memory", TurnStatus.REFUSED)
        self._seq = memory.next_seq
        self._event("load_memory", f"{memory.message_count} stored message(s)")
        # 2-3. system and user messages from the service's templates
        variables = {**turn.variables, "message": turn.message}
        try:
            system = render_template(spec.system_prompt, variables)
            user = render_template(spec.user_template, variables)
        except TurnstileError as exc:
            raise TurnStopped(TurnStatus.FAILED, exc.error_type, str(exc)) from exc
        # 4. turn started
        self._event("turn_started", f"conversation {turn.conversation_id}, user {turn.user_id}")
        # 10. write memory: the user message is stored before the model is called
        new = [ChatMessage(role="system", content=system)] if system and system != memory.system_prompt else []
        new.append(ChatMessage(role="user", content=user))
        await self._append(turn, new)
        # 12-14. tool context, first model request, tool round-trip loop
        return await self._loop(turn, spec)

    async def _loop(self, turn: TurnInput, spec: ServiceSpec) -> str:
        tool_names = [t.name for t in spec.tools]
        while True:
            response = await self._call_model(turn, spec, tool_names)
            step = next_step(response.message)
            if isinstance(step, FinalAnswer):
                self._event("answer", step.text[:160])
                return step.text
            assert isinstance(step, RunTools)
            self._round_trips += 1
            if self._round_trips > spec.loop.max_round_trips:
                err = RoundTripCapExceeded(spec.loop.max_round_trips)
                raise TurnStopped(TurnStatus.FAILED, err.error_type, str(err))
            await self._run_round(turn, spec, step.calls)

    async def _call_model(self, turn: TurnInput, spec: ServiceSpec,
                          tool_names: list[str]) -> io.ModelCallResult:
        self._step = "model_call"
        seq = self._alloc(1)
        result = await self._activity(
            io.CALL_MODEL,
            io.ModelCallInput(conversation_id=turn.conversation_id, service=turn.service,
                              tool_names=tool_names, response_seq=seq, round=self._round_trips),
            io.ModelCallResult, f"model round {self._round_trips + 1}", TurnStatus.FAILED,
            options=model_options(spec.loop),
        )
        self._usage = self._usage + result.usage
        self._provider = result.provider
        calls = ", ".join(c.name for c in result.message.tool_calls)
        self._event("model_call", f"asked for {calls}" if calls else "answered")
        return result

    async def _run_round(self, turn: TurnInput, spec: ServiceSpec, calls: list[ToolCall]) -> None:
        """Run one response's calls: concurrently if several; results in call order."""
        self._step = "tools"
        base = self._alloc(len(calls))
        records = [ToolCallRecord(id=c.id, name=c.name, arguments=parsed_arguments(c.arguments),
                                  round=self._round_trips) for c in calls]
        self._calls.extend(records)
        late: list[tuple[int, ChatMessage]] = []  # results the workflow itself writes
        jobs = [self._one_call(turn, spec, c, r, base + i, late)
                for i, (c, r) in enumerate(zip(calls, records, strict=True))]
        outcome = await asyncio.gather(*jobs, return_exceptions=True)
        for seq, msg in sorted(late, key=lambda x: x[0]):
            await self._append(turn, [msg], seq=seq)
        for o in outcome:
            if isinstance(o, BaseException):
                raise o

    async def _one_call(self, turn: TurnInput, spec: ServiceSpec, call: ToolCall,
                        rec: ToolCallRecord, seq: int,
                        late: list[tuple[int, ChatMessage]]) -> None:
        tool = spec.tool(call.name)
        if tool is None:
            self._finish(rec, CallStatus.UNKNOWN_TOOL, "unknown tool")
            if spec.loop.on_unknown_tool == "fail":
                late.append((seq, _result_msg(call, f"Tool {call.name!r} does not exist.", rec)))
                raise TurnStopped(TurnStatus.FAILED, "UnknownTool",
                                  f"the model called {call.name!r}, which does not exist")
            names = ", ".join(t.name for t in spec.tools)
            late.append((seq, _result_msg(
                call, f"Tool {call.name!r} does not exist. Available tools: {names}.", rec)))
            return
        if tool.requires_approval:
            decision = await self._await_approval(call, rec, tool)
            if not decision.approved:
                text = (f"The call to {call.name} was rejected by {decision.reviewer}"
                        + (f": {decision.note}" if decision.note else "") + ". It did not run.")
                self._finish(rec, CallStatus.REJECTED, text)
                late.append((seq, _result_msg(call, text, rec)))
                return
        self._event("tool_call", f"{call.name} {call.arguments[:120]}")
        try:
            out = await workflow.execute_activity(
                io.EXECUTE_TOOL,
                io.ToolExecInput(conversation_id=turn.conversation_id, user_id=turn.user_id,
                                 service=turn.service, call=call, result_seq=seq),
                result_type=io.ToolOutcome, summary=call.name, **tool_options(tool),
            )
        except ActivityError as exc:
            cause = exc.cause
            text = f"{call.name} failed: {cause.message if isinstance(cause, ApplicationError) else exc}"
            self._finish(rec, CallStatus.FAILED, text)
            late.append((seq, _result_msg(call, text, rec)))
            if tool.fatal_on_failure:
                raise TurnStopped(TurnStatus.FAILED, "FatalToolFailure", text) from exc
            return
        self._finish(rec, CallStatus(out.status), out.preview)
        if out.status == CallStatus.INVALID_ARGUMENTS:
            self._arg_errors[call.name] = self._arg_errors.get(call.name, 0) + 1
            if (spec.loop.on_invalid_arguments == "fail"
                    or self._arg_errors[call.name] > spec.loop.argument_error_budget):
                raise TurnStopped(TurnStatus.FAILED, "ToolArgumentError", out.preview)

    async def _await_approval(self, call: ToolCall, rec: ToolCallRecord,
                              tool: ToolSpec) -> ApprovalDecision:
        self._step = "awaiting_approval"
        now = workflow.now()
        timeout = timedelta(seconds=tool.approval_timeout_seconds)
        self._pending[call.id] = PendingApproval(
            tool_call_id=call.id, tool_name=call.name, arguments=rec.arguments,
            requested_at=now.isoformat(), deadline=(now + timeout).isoformat())
        self._event("awaiting_approval", f"{call.name} call {call.id}")
        try:
            await workflow.wait_condition(lambda: call.id in self._decisions, timeout=timeout)
        except TimeoutError:
            self._decisions[call.id] = ApprovalDecision(
                tool_call_id=call.id, approved=False, reviewer="deadline",
                note=f"no decision within {tool.approval_timeout_seconds:g} s",
                decided_at=workflow.now().isoformat())
        finally:
            self._pending.pop(call.id, None)
        decision = self._decisions[call.id]
        self._event("approval", f"{call.name} {'approved' if decision.approved else 'rejected'} "
                                f"by {decision.reviewer}")
        self._step = "tools"
        return decision

    # -- plumbing --------------------------------------------------------------
    async def _activity(self, name: str, arg: object, result_type: type, summary: str,
                        status_on_error: TurnStatus, options: dict | None = None):  # type: ignore[no-untyped-def]
        """Run an edge activity; a non-retryable failure ends the turn with its type."""
        self._step = summary.split(" ")[0]
        try:
            return await workflow.execute_activity(
                name, arg, result_type=result_type, summary=summary,
                **(options or memory_options()))
        except ActivityError as exc:
            cause = exc.cause
            if isinstance(cause, ApplicationError):
                raise TurnStopped(status_on_error, cause.type or "ApplicationError",
                                  cause.message) from exc
            raise TurnStopped(status_on_error, type(cause).__name__, str(cause)) from exc

    async def _append(self, turn: TurnInput, messages: list[ChatMessage],
                      seq: int | None = None) -> None:
        start = self._alloc(len(messages)) if seq is None else seq
        await self._activity(io.APPEND_MESSAGES, io.AppendMessagesInput(
            conversation_id=turn.conversation_id, user_id=turn.user_id, start_seq=start,
            messages=messages), type(None), "append_messages", TurnStatus.FAILED)

    def _alloc(self, n: int) -> int:
        start, self._seq = self._seq, self._seq + n
        return start

    def _event(self, step: str, detail: str) -> None:
        self._events.append(TurnEvent(step=step, detail=detail))
        del self._events[:-MAX_EVENTS]
        workflow.logger.info("%s: %s", step, detail)

    def _finish(self, rec: ToolCallRecord, status: CallStatus, preview: str) -> None:
        rec.status = status
        rec.is_error = status not in (CallStatus.COMPLETED, CallStatus.PENDING)
        rec.result_preview = preview[:400]
        self._event("tool_result", f"{rec.name}: {status.value}")

    def _result(self, turn: TurnInput, status: TurnStatus, answer: str | None,
                error: TurnErrorInfo | None) -> TurnResult:
        self._step = status.value
        self._event("turn_completed", f"{status.value}, {self._round_trips} round trip(s)")
        return TurnResult(
            status=status, answer=answer, round_trips=self._round_trips, tool_calls=self._calls,
            error=error, workflow_id=workflow.info().workflow_id,
            conversation_id=turn.conversation_id, service=turn.service, provider=self._provider,
            usage=self._usage.model_dump(),
        )


def _result_msg(call: ToolCall, text: str, rec: ToolCallRecord) -> ChatMessage:
    return ChatMessage(role="tool", content=text, tool_call_id=call.id, is_error=True,
                       attributes={attr.TOOL_NAME: call.name, attr.OUTCOME: rec.status.value})
