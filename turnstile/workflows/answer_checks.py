"""Honest endings for final answers that are not answers (
turnstile.engine.answer_rules): an empty answer is asked for once more
without tools, then ends the turn `failed` (`EmptyAnswer`); a tool call
written as text ends it `failed` (`ToolCallAsText`) without running it;
from revision 6, a call written as text that does not parse (a bare
`functions.NAME:`) ends it `failed` (`DeadEndCalls`: the model loop counts
such answers first, turnstile.engine.dead_ends; one reaches these checks
only after the model was asked without tools); from revision 9, an answer
that writes a tool result itself (`<tool_response>...`) is asked for once
more without tools, then ends the turn `failed` (`FabricatedToolResult`).
Each new path asks its patch (turnstile.engine.versions) only when it is
taken, so a turn that answers plainly carries no marker. Deterministic code
only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io, answer_rules as rules, dead_ends
    from turnstile.engine.contract import TurnStatus
    from turnstile.engine.errors import (
        DeadEndCalls,
        EmptyAnswer,
        FabricatedToolResult,
        ToolCallAsText,
    )
    from turnstile.engine.masking import mask_prefix
    from turnstile.engine.versions import EMPTY_ANSWER_REASKED, TOOL_CALL_AS_TEXT
    from turnstile.workflows.state import TurnState, TurnStopped

AskAgain = Callable[[str], Awaitable[io.ModelCallResult]]  # the nudge -> the new response
Discard = Callable[[str], Awaitable[None]]  # the reason -> the latest answer discarded


class AnswerChecks:
    """One per turn: the empty-answer re-ask, and the made-up-result re-ask,
    each happen once in a turn, however many answers the output guardrails
    ask for."""

    def __init__(self, state: TurnState, ask_again: AskAgain, discard: Discard) -> None:
        self.s, self.ask_again, self.discard = state, ask_again, discard
        self.reasked = False
        self.fabrication_reasked = False  # from revision 9

    async def checked(self, text: str) -> str:
        """The final answer, or the turn ends (TurnStopped)."""
        s = self.s
        dead_ends_end_turn = s.revision.dead_ends_end_turn
        if dead_ends_end_turn:
            unparsed = rules.unparsed_call(text, s.tool_names)
            if unparsed is not None:
                await self.discard("dead_end")
                what = dead_ends.text_dead_end(text, s.tool_names, ()) or unparsed
                s.event("dead_end", f"the model kept {what}")
                raise TurnStopped(TurnStatus.FAILED,
                                  DeadEndCalls(dead_ends.STOPPED.format(what=what)),
                                  compensate=False)
        # Before revision 6 a bare `functions.NAME:` read as a call with `{}`.
        name = rules.tool_call_as_text(text, s.tool_names, bare_heads=not dead_ends_end_turn)
        if name is not None and workflow.patched(TOOL_CALL_AS_TEXT):
            s.event("answer", f"a call of {name} written as text: not run")
            raise TurnStopped(TurnStatus.FAILED,
                              ToolCallAsText(rules.TOOL_CALL_AS_TEXT_MESSAGE.format(name=name)),
                              compensate=False)
        if s.revision.fabricated_results_reasked:
            wrote = rules.fabricated_result(text)
            if wrote is not None:
                return await self._fabricated(wrote)
        if not rules.is_empty(text) or not workflow.patched(EMPTY_ANSWER_REASKED):
            return text
        await self.discard("empty_answer")  # never sent to the model again
        if self.reasked:
            raise TurnStopped(TurnStatus.FAILED, EmptyAnswer(rules.EMPTY_MESSAGE),
                              compensate=False)
        self.reasked = True
        s.event("empty_answer", "the answer was empty; asking once more without tools")
        response = await self.ask_again(rules.EMPTY_NUDGE)
        return await self.checked(response.message.content or "")

    async def _fabricated(self, wrote: str) -> str:
        """The answer wrote a tool result itself (revision 9): discarded
        (never sent to the model again, never the turn's answer); asked once
        more without tools, then `FabricatedToolResult`."""
        s = self.s
        more = "..." if len(wrote) > rules.EXCERPT_CHARS else ""
        what = f"`{mask_prefix(wrote, rules.EXCERPT_CHARS)}{more}`"
        await self.discard("fabricated_result")
        if self.fabrication_reasked:
            s.event("fabricated_result", f"the model wrote a tool result again ({what}): "
                                         "the turn is stopped")
            raise TurnStopped(TurnStatus.FAILED,
                              FabricatedToolResult(rules.FABRICATED_MESSAGE.format(what=what)),
                              compensate=False)
        self.fabrication_reasked = True
        s.event("fabricated_result", f"the answer wrote a tool result itself ({what}); asking "
                                     "once more without tools")
        response = await self.ask_again(rules.FABRICATED_NUDGE)
        return await self.checked(response.message.content or "")
