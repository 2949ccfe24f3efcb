"""A model that is a Python function: `FunctionModel(fn)` and `ScriptedModel(steps)`.

The function gets what the model would get (`ModelCall`: the messages and the
tools offered, plus what a script needs most — the user's own words and the
tool results since them) and returns what the model would say: a text answer
(`str`), one tool call (`call("name", arg=...)`), several calls in one
response (a list of them), or a full `ModelResponse`. It runs in the model
activity like any provider, so its answers are recorded in the turn's history
and in memory exactly as a real model's are.

Use it for an offline demo of a service (`Service(offline_model=...)`: used
instead of the offline demo planner when no LLM_BASE_URL is set) and in tests
(`turnstile.testing`). The function must decide from the request alone — no
state of its own between calls — because a model activity may run again
(a retry, a lost worker) and must then give the same answer.
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from turnstile.engine.approvals import EDIT_NOTE_PREFIX, changed_fields, split_edit_note
from turnstile.engine.attributes import EDITED, RAW_USER_MESSAGE
from turnstile.engine.errors import ModelFunctionError
from turnstile.engine.masking import mask_text
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.engine.safe_text import safe_text
from turnstile.engine.specs import ToolSpec
from turnstile.providers.base import ModelRequest, ModelResponse

__all__ = ["Call", "Edits", "FieldEdit", "FunctionModel", "ModelCall", "ModelFunctionError",
           "Reply", "ScriptedModel", "ToolOutcome", "call"]

MODEL = "turnstile-function-model"

log = logging.getLogger(__name__)
_MESSAGE_MAX = 1000  # a model function's error, as the turn's failure says it


@dataclass(frozen=True)
class Call:
    """A tool call the function asks for (its id is given by the model)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def call(name: str, /, **arguments: Any) -> Call:
    """`call("refund", order_id="A-1", amount_cents=500)`: one tool call."""
    return Call(name, dict(arguments))


@dataclass(frozen=True)
class FieldEdit:
    """One argument a reviewer changed: the model's value and the reviewer's
    (None where the field was absent: `added` / `removed` say which)."""

    before: Any
    after: Any
    added: bool = False
    removed: bool = False


@dataclass(frozen=True)
class Edits:
    """A call a reviewer approved with edits: who, each changed field, and the
    arguments the tool ran with (`ToolOutcome.arguments` stays the model's)."""

    reviewer: str
    changes: dict[str, FieldEdit]
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolOutcome:
    """A tool result that came back since the user's message."""

    name: str
    arguments: dict[str, Any]  # the call as the model made it
    result: Any  # what the tool returned: parsed from JSON when it is JSON, else the text
    is_error: bool
    text: str  # the result as the model reads it
    # Approved with edits: who changed what (the result is still the tool's own).
    edits: Edits | None = None


@dataclass(frozen=True)
class ModelCall:
    """One model request, as the function sees it."""

    messages: list[ChatMessage]
    tools: list[ToolSpec]
    user_text: str  # the user's own words in this turn (retrieved text left out)
    results: list[ToolOutcome]  # since the user's message, in order
    step: int  # model responses already given since the user's message (0: first)

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    def result_of(self, name: str) -> ToolOutcome | None:
        """The latest result of tool `name` in this turn, or None."""
        found = [r for r in self.results if r.name == name]
        return found[-1] if found else None


Reply: TypeAlias = "str | Call | Sequence[Call] | ModelResponse"
ModelFunction = Callable[[ModelCall], "Reply | Awaitable[Reply]"]


class FunctionModel:
    """A model provider that asks `fn` (sync or async) for every response."""

    supports_response_format = False  # typed services get format instructions

    def __init__(self, fn: ModelFunction, *, name: str | None = None) -> None:
        self.fn = fn
        self.model = name or f"function:{getattr(fn, '__name__', 'model')}"
        self.name = "function-model"

    async def aclose(self) -> None:
        return None

    async def complete(self, request: ModelRequest) -> ModelResponse:
        seen = model_call(request)
        try:
            reply = self.fn(seen)
            if inspect.isawaitable(reply):
                reply = await reply
        except (OSError, TimeoutError):
            raise  # an outage the function met: retried like a model server's
        except Exception as exc:
            where = raised_at(exc)
            log.error("the model function %s raised %s%s", self.model.removeprefix("function:"),
                      type(exc).__name__,
                      f" at {where}" if where else "", exc_info=exc)
            text = (f"the model function {self.model.removeprefix('function:')} raised "
                    f"{type(exc).__name__}: {exc}" + (f" at {where}" if where else ""))
            raise ModelFunctionError(mask_text(safe_text(text))[:_MESSAGE_MAX]) from exc
        try:
            return self.response(reply, f"call_{len(request.messages)}")
        except TypeError as exc:  # a reply that is none of the kinds a function may give
            raise ModelFunctionError(mask_text(safe_text(str(exc)))[:_MESSAGE_MAX]) from exc

    def response(self, reply: Reply, prefix: str) -> ModelResponse:
        if isinstance(reply, ModelResponse):
            return reply
        if isinstance(reply, str):
            return ModelResponse(message=ChatMessage(role="assistant", content=reply),
                                 finish_reason="stop", model=self.model)
        given: list[Any] = [reply] if isinstance(reply, Call) else (
            list(reply) if isinstance(reply, Sequence) else [])
        calls = [c for c in given if isinstance(c, Call)]
        if not calls or len(calls) != len(given):
            raise TypeError(f"{self.model}: a model function returns a str, call(...), a list "
                            f"of call(...) or a ModelResponse, not {reply!r}")
        return ModelResponse(
            message=ChatMessage(role="assistant", content=None, tool_calls=[
                ToolCall(id=f"{prefix}_{n}", name=c.name, arguments=json.dumps(c.arguments))
                for n, c in enumerate(calls)]),
            finish_reason="tool_calls", model=self.model)


class ScriptedModel(FunctionModel):
    """The same steps for every turn: step n is the reply to the n-th model
    request after the user's message (a tool round is one step). After the
    last step: `done` as the answer."""

    def __init__(self, steps: Sequence[Reply], *, done: str = "(the script has no more steps)",
                 name: str = "scripted") -> None:
        self.steps = list(steps)
        self.done = done
        super().__init__(self._step, name=f"function:{name}")

    def _step(self, request: ModelCall) -> Reply:
        if request.step < len(self.steps):
            return self.steps[request.step]
        return self.done


def model_call(request: ModelRequest) -> ModelCall:
    msgs = request.messages
    last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
    user = msgs[last_user] if last_user >= 0 else None
    text = (user.attributes.get(RAW_USER_MESSAGE) or user.content or "") if user else ""
    since = msgs[last_user + 1:]
    calls = {c.id: c for m in since for c in m.tool_calls}
    results = []
    for m in since:
        made = calls.get(m.tool_call_id or "")
        if m.role != "tool" or made is None:
            continue
        asked = _json(made.arguments, {})
        edits, content = outcome_edits(m, asked)
        results.append(ToolOutcome(name=made.name, arguments=asked,
                                   result=_json(content, content), is_error=m.is_error,
                                   text=content, edits=edits))
    step = sum(1 for m in since if m.role == "assistant")
    return ModelCall(messages=list(msgs), tools=list(request.tools), user_text=str(text),
                     results=results, step=step)


def outcome_edits(m: ChatMessage, asked: dict[str, Any]) -> tuple[Edits | None, str]:
    """A tool message's edits (attribute `turnstile.edited`) and the tool's own
    result. A result stored before 0.5 carried its edit note as its first
    line: the note is taken off, and its edits name the reviewer only."""
    content = m.content or ""
    recorded = m.attributes.get(EDITED)
    if isinstance(recorded, dict):
        before = recorded.get("model_arguments")
        after = recorded.get("arguments")
        old = before if isinstance(before, dict) else asked
        new = after if isinstance(after, dict) else {}
        changes = {f: FieldEdit(before=old.get(f), after=new.get(f), added=f not in old,
                                removed=f not in new)
                   for f in recorded.get("changed") or changed_fields(old, new)}
        return Edits(reviewer=str(recorded.get("by", "")), changes=changes,
                     arguments=dict(new)), content
    note, rest = split_edit_note(content)
    if note is None:
        return None, content
    reviewer = note[len(EDIT_NOTE_PREFIX):].split(" edited ", 1)[0]
    try:
        name = ast.literal_eval(reviewer)
    except (ValueError, SyntaxError):
        name = reviewer
    return Edits(reviewer=str(name), changes={}, arguments={}), rest


_OWN_CODE = str(Path(__file__).resolve().parents[1])  # turnstile/ itself


def raised_at(exc: BaseException) -> str:
    """Where `exc` was raised in the user's own code: "FILE:LINE in FUNCTION:
    CODE" of the innermost frame outside turnstile/ (its frames are not the
    user's), or "" when there is none."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not str(Path(f.filename).resolve()).startswith(_OWN_CODE)]
    if not frames:
        return ""
    f = frames[-1]
    code = f" `{f.line.strip()}`" if f.line else ""
    return f"{f.filename}:{f.lineno} in {f.name}{code}"


def _json(text: str, default: Any) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return default
