"""Steps 12-14 (docs/pipeline.md): the model and tool loop. Ask the model
(with the tools dynamic providers add); run the tools it asks for, a round at
a time, until it answers; the breakers, the round-trip cap and moderation
stop it; from revision 6, dead ends (turnstile.engine.dead_ends) end it
after one ask without tools. Deterministic code only.
"""

from __future__ import annotations

from typing import assert_never

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io, dead_ends, endings, repeats
    from turnstile.engine.breakers import Breakers
    from turnstile.engine.contract import CallStatus, TurnInput, TurnStatus
    from turnstile.engine.errors import (
        AnswerTruncated,
        ContentFiltered,
        DeadEndCalls,
        RoundTripCapExceeded,
    )
    from turnstile.engine.masking import mask_prefix
    from turnstile.engine.messages import ChatMessage, ToolCall
    from turnstile.engine.specs import ServiceSpec
    from turnstile.engine.tool_round_rules import round_stop
    from turnstile.engine.turn_rules import FinalAnswer, RunTools, next_step
    from turnstile.workflows.answer_checks import AnswerChecks
    from turnstile.workflows.pipeline_steps import PipelineSteps, Prepared
    from turnstile.workflows.state import TurnState, TurnStopped
    from turnstile.workflows.steer_signal import steered_stop
    from turnstile.workflows.tool_options import listing_options, model_options
    from turnstile.workflows.tool_round import RoundWrites, ToolRound


class ModelLoop:
    def __init__(self, state: TurnState, turn: TurnInput, spec: ServiceSpec,
                 steps: PipelineSteps, prepared: Prepared) -> None:
        self.s, self.turn, self.spec, self.steps = state, turn, spec, steps
        self.stream = prepared.stream
        self.response_format = prepared.response_format
        # One set of breakers per turn: a re-ask (steps 15/16) does not reset them.
        self.breakers = Breakers(spec.loop.breakers)
        self.round: ToolRound | None = None  # the tool round under way
        # Empty answers and tool calls written as text (workflows/answer_checks.py).
        self.answers = AnswerChecks(state, self._ask_again, steps.answer.discard_answer)
        self.dead = dead_ends.DeadEnds()  # from revision 6: dead-end responses in a row

    async def run(self) -> str:
        """Until the model answers: its answer. Each response is one typed next
        step (turnstile.engine.turn_rules.next_step) dispatched here: a final
        answer, or tools to run (a call that needs approval is the tool
        round's own step, AwaitApproval). A handler returns the turn's answer,
        or None to ask the model again."""
        while True:
            if self.spec.dynamic_tools:
                await self._resolve_tools()
            response = await self._honest_ending(await self._call_model())
            step = next_step(response.message)
            match step:
                case FinalAnswer():
                    answer = await self._final_answer(step)
                case RunTools():
                    answer = await self._run_tools(step)
                case _:
                    assert_never(step)
            if answer is not None:
                return answer

    async def _final_answer(self, step: FinalAnswer) -> str | None:
        """The model answered: the answer, checked; from revision 6 an answer
        that is a dead end is discarded and the model asked again."""
        s = self.s
        if s.revision.dead_ends_end_turn:
            what = dead_ends.text_dead_end(step.text, s.tool_names, self.breakers.disabled,
                                           self.breakers.withheld)
            if what is not None:  # never sent to the model again; ask it again
                await self.steps.answer.discard_answer("dead_end")
                s.event("dead_end", f"the model answered by {what}")
                if self.dead.record(what):
                    return await self._dead_end_ask()
                return None
        text = await self.answers.checked(step.text)
        s.event("answer", mask_prefix(text, 400)[:160])
        return text

    async def _run_tools(self, step: RunTools) -> str | None:
        """The model asked for tools: one round of them, unless moderation, a
        breaker or the round-trip cap stops it (the calls then get results
        that say so). The answer when the loop ends here, else None."""
        s, spec = self.s, self.spec
        dead_ends_end_turn = s.revision.dead_ends_end_turn
        try:
            await self.steps.check_moderation(wait=False)  # a flagged input runs no tools
        except TurnStopped as stop:
            await self._record_unrun(step.calls, str(stop))
            raise
        s.round_trips += 1
        dead_end = self._dead_end(step.calls) if dead_ends_end_turn else None
        limit = round_stop(s.round_trips, [c.name for c in step.calls], spec.loop,
                           self.breakers)
        if limit is not None:
            await self._record_unrun(step.calls, str(limit))
            # From revision 6 the cap never ends a run of dead ends: they do.
            if (isinstance(limit, RoundTripCapExceeded) and dead_ends_end_turn
                    and self.dead.record(dead_end)):
                return await self._dead_end_ask()
            raise TurnStopped(TurnStatus.FAILED, limit)
        s.machine.start_round()
        self.round = ToolRound(s, self.turn, spec, self.breakers)
        await self.round.run(step.calls, s.alloc(len(step.calls)))
        self.round = None
        if s.steered is not None:  # a new message: the new turn asks the model
            raise steered_stop(s, spec)
        if dead_ends_end_turn and self.dead.record(dead_end):
            return await self._dead_end_ask()
        if self.breakers.repeats >= repeats.ANSWER_AFTER:  # only after repeat-breaker
            return await self._answer_now()
        return None

    async def _honest_ending(self, response: io.ModelCallResult) -> io.ModelCallResult:
        """Only a natural stop is a complete answer (turnstile.engine.endings).
        The extra activities run only on the path that needs them."""
        ends = endings.ending(response.finish_reason)
        if ends is endings.AnswerEnding.FILTERED:
            return await self._filtered()
        if ends is not endings.AnswerEnding.LENGTH or response.message.tool_calls:
            return response  # cut tool arguments fail validation and go back to the model
        self.s.event("truncated", "answer cut at the length limit; asking to continue")
        more = await self._call_model(continuation=True)
        text = (response.message.content or "") + (more.message.content or "")
        ends = endings.ending(more.finish_reason)
        if ends is endings.AnswerEnding.FILTERED:
            return await self._filtered()
        if ends is endings.AnswerEnding.LENGTH:
            raise TurnStopped(TurnStatus.TRUNCATED, AnswerTruncated(endings.TRUNCATED_MESSAGE),
                              answer=text, compensate=False)
        message = ChatMessage(role="assistant", content=text)
        return more.model_copy(update={"message": message, "usage": response.usage + more.usage})

    async def _answer_now(self) -> str:
        """The model keeps repeating calls that already ran (turnstile.engine.repeats):
        its answer, asked for without tools."""
        self.s.event("breaker", "calls repeated after the model was told; asking for the "
                                "answer without tools")
        response = await self._ask_again(repeats.ANSWER_NOW)
        text = await self.answers.checked(response.message.content or "")
        self.s.event("answer", mask_prefix(text, 400)[:160])
        return text

    def _dead_end(self, calls: list[ToolCall]) -> str | None:
        """A response whose every call is a dead end: what the first does."""
        found = [dead_ends.call_dead_end(c.name, c.arguments, self.spec.tool(c.name),
                                         self.breakers.is_disabled(c.name),
                                         self.breakers.is_withheld(c.name)) for c in calls]
        return found[0] if found and all(found) else None

    async def _dead_end_ask(self) -> str:
        """The model made dead-end calls `DEAD_END_AFTER` times in a row
        (turnstile.engine.dead_ends): its answer, asked for once without
        tools; a call written as text again ends the turn `DeadEndCalls`."""
        s, what = self.s, self.dead.what
        s.event("dead_end", f"the model kept {what}; asking for the answer without tools")
        response = await self._ask_again(dead_ends.ASK_NOW.format(what=what))
        text = response.message.content or ""
        # A call the server parsed although no tool was offered is dropped by
        # the model activity (it has no result slot); its finish reason says so.
        called = not text.strip() and response.finish_reason == "tool_calls"
        if called or dead_ends.written_call(text, s.tool_names) is not None:
            await self.steps.answer.discard_answer("dead_end")
            s.event("dead_end", f"the model kept {what}: the turn is stopped")
            raise TurnStopped(TurnStatus.FAILED, DeadEndCalls(dead_ends.STOPPED.format(what=what)),
                              compensate=False)
        text = await self.answers.checked(text)
        self.dead.in_row = 0  # answered: a later re-ask (steps 15/16) counts afresh
        s.event("answer", mask_prefix(text, 400)[:160])
        return text

    def _offered(self) -> list[str]:
        """The tools a request offers: from revision 6 not those a breaker
        disabled, nor (revision 10) those withheld for same reads."""
        if not self.s.revision.dead_ends_end_turn:
            return list(self.s.tool_names)
        return [n for n in self.s.tool_names
                if not self.breakers.is_disabled(n) and not self.breakers.is_withheld(n)]

    async def _ask_again(self, nudge: str) -> io.ModelCallResult:
        """Ask once more without tools, `nudge` sent after the stored conversation."""
        return await self._honest_ending(await self._call_model(continuation=True, nudge=nudge))

    async def _filtered(self) -> io.ModelCallResult:
        self.s.event("moderation", "the provider's content filter withheld the answer")
        await self.steps.answer.discard_answer("content_filter")
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

    async def _resolve_tools(self) -> None:
        """Step 12: dynamic providers may add tools, never remove one."""
        s, turn, spec = self.s, self.turn, self.spec
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

    async def _call_model(self, continuation: bool = False,
                          nudge: str = "") -> io.ModelCallResult:
        s, turn, spec = self.s, self.turn, self.spec
        s.machine.call_model()
        prelude, prelude_seq = s.take_prelude()
        s.answer_seq = s.alloc(1)
        summary = f"model round {s.round_trips + 1}" + (" continuation" if continuation else "")
        result = await s.activity(
            io.call_model,
            io.ModelCallInput(conversation_id=turn.conversation_id, service=turn.service,
                              execution_chain=s.chain,
                              tool_names=[] if continuation else self._offered(),
                              response_seq=s.answer_seq, round=s.round_trips,
                              taken_call_ids=[c.id for c in s.calls], stream=self.stream,
                              response_format=self.response_format, window=spec.memory,
                              continuation=continuation, nudge=nudge, prelude=prelude,
                              prelude_seq=prelude_seq, user_id=turn.user_id,
                              known_policies=[t.name for t in spec.tools],
                              model=spec.model),
            summary, TurnStatus.FAILED, options=model_options(spec.loop))
        for t in result.tools:  # policies of tools this turn calls for the first time
            if spec.tool(t.name) is None:
                spec.tools.append(t)
        s.usage = s.usage + result.usage
        s.provider = result.provider
        calls = ", ".join(c.name for c in result.message.tool_calls)
        s.event("model_call", f"asked for {calls}" if calls else "answered")
        return result
