"""The offline demo planner: a deterministic stand-in for a model, used when
LLM_BASE_URL is unset. It is NOT a language model. It speaks the provider
interface and follows scripts the apps hand it (`DemoScript`; the sales
app's is turnstile.sales.planner): each reads the user's own words and the
tool results that came back since, and either answers the request with real
tool calls or a labelled answer, or passes. No script takes the request: a
labelled answer says what the scripts can do offline.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

from turnstile.engine.attributes import RAW_USER_MESSAGE
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.providers.base import ModelRequest, ModelResponse

LABEL = "[offline demo planner]"
MODEL = "turnstile-demo-planner"


@dataclass(frozen=True)
class PlannerTurn:
    """What a script sees of one model request."""

    text: str  # the user's own words (retrieved text left out)
    # tool name -> (its result, parsed from JSON when it is JSON; is it an error),
    # for the calls made since the user's message
    results: dict[str, tuple[Any, bool]]
    available: frozenset[str]  # the tools the request offers
    call_prefix: str  # unique per request: `f"{call_prefix}_{n}"` names call n
    today: date

    def call_id(self, n: int) -> str:
        return f"{self.call_prefix}_{n}"


class DemoScript(Protocol):
    # What to ask for to use this script, said when no script takes a request.
    hint: str

    def plan(self, turn: PlannerTurn) -> ModelResponse | None:
        """The next response of a request this script serves; None: not its request."""
        ...


def say(text: str) -> ModelResponse:
    """A final answer, labelled as the planner's."""
    return ModelResponse(
        message=ChatMessage(role="assistant", content=f"{LABEL} {text}"),
        finish_reason="stop", model=MODEL,
    )


def call(*calls: ToolCall) -> ModelResponse:
    """Tool calls, all in one response."""
    return ModelResponse(
        message=ChatMessage(role="assistant", content=None, tool_calls=list(calls)),
        finish_reason="tool_calls", model=MODEL,
    )


class DemoPlanner:
    name = "offline-demo-planner"
    supports_response_format = False  # it cannot write JSON: typed services get instructions
    model = MODEL

    def __init__(self, scripts: Sequence[DemoScript] = (),
                 today: Callable[[], date] | None = None) -> None:
        self.scripts = list(scripts)
        self._today = today  # None = the real clock

    def today(self) -> date:
        return self._today() if self._today else date.today()

    async def aclose(self) -> None:
        return None

    async def complete(self, request: ModelRequest) -> ModelResponse:
        msgs = request.messages
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
        # Plan from the user's own words: retrieved text (step 5) may hold
        # numbers and addresses that are not the request's.
        user = msgs[last_user] if last_user >= 0 else None
        text = ((user.attributes.get(RAW_USER_MESSAGE) or user.content or "")
                if user is not None else "")
        turn = PlannerTurn(text=str(text), results=_results_since(msgs[last_user + 1:]),
                           available=frozenset(t.name for t in request.tools),
                           call_prefix=f"call_{len(msgs)}", today=self.today())
        for script in self.scripts:
            response = script.plan(turn)
            if response is not None:
                return response
        if not self.scripts:
            return say("No offline script is installed. Set LLM_BASE_URL to use a real model.")
        hints = "; or ".join(s.hint for s in self.scripts)
        return say(f"I can only run scripted scenarios offline: {hints}. "
                   "Set LLM_BASE_URL to use a real model.")


def _results_since(msgs: list[ChatMessage]) -> dict[str, tuple[Any, bool]]:
    names = {c.id: c.name for m in msgs for c in m.tool_calls}
    out: dict[str, tuple[Any, bool]] = {}
    for m in msgs:
        if m.role == "tool" and m.tool_call_id in names:
            try:
                body: Any = json.loads(m.content or "")
            except ValueError:
                body = m.content
            out[names[m.tool_call_id]] = (body, m.is_error)
    return out
