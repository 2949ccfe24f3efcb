"""Hostile inputs, generated (Hypothesis), thrown at real turns: what
tests/test_hostile_inputs.py runs a bounded number of and
`python -m bench.hostile_inputs` runs many of.

`turn_payloads()` draws the JSON a caller could send as a turn's input —
every TurnInput field valid, hostile (lone surrogates, NUL, controls,
bidi and zero-width characters, huge text, numbers past 64 bits, NaN), of
the wrong type, or missing, with `variables` nested up to 3,000 deep or
huge and attachments with hostile fields — and `query_args()` the argument
a caller could send with a query. The payload is sent as raw JSON (as
`temporal workflow start --input` sends it), not through TurnInput.

`HostileRig` runs one worker (the product's own `build_worker`) in a thread
of its own against a real dev server and database; `check(payload, args)`
starts a turn with the payload, then asserts the promises for hostile input: it
ends within seconds in a documented state (never `UnexpectedError`), no
workflow task failed, its conversation is released, the next turn on it
completes, and queries with hostile arguments answer or refuse at once.
Signal and update payloads are helper "door"'s (the second part):
`HostileRig.client` and `HostileRig.started` are the hook to add them.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import strategies as st
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import RawValue
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from tests.support.services import make_service
from tests.support.sql import fetchone
from tests.support.turns import Turns, running_worker
from turnstile.engine import errors
from turnstile.engine.contract import WORKFLOW_TYPE, TurnInput, TurnResult, TurnStatus
from turnstile.engine.safe_text import unsafe_text_at
from turnstile.engine.turn_input_rules import turn_input_problem
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

T = TypeVar("T")

# Where the rig puts a fresh conversation id (so the next turn is this turn's alone).
FRESH = "\x00fresh-conversation"
ENDS_WITHIN = 15.0  # seconds: a turn that takes longer is "left retrying"


async def within(work: Awaitable[T], what: str) -> T:
    """`work`, or a TimeoutError that says which step of the check it was."""
    try:
        return await asyncio.wait_for(work, ENDS_WITHIN)
    except TimeoutError:
        raise TimeoutError(f"{what} did not end within {ENDS_WITHIN:.0f} s") from None


@dataclass(frozen=True)
class Deep:
    """A value nested `depth` lists deep, written as JSON text (no encoder recursion)."""

    depth: int

    def text(self) -> str:
        return "[" * self.depth + "1" + "]" * self.depth


@dataclass(frozen=True)
class Huge:
    chars: int

    def text(self) -> str:
        return json.dumps("x" * self.chars)


SPECIALS = ["\ud800", "\udfff", "a\udc00b", "\x00", "\x1b[31m", "\u200b", "\u202e", "\u2028",
            "\ufffd", "\ufeff", "\u0085", " ", "\t\n", "é", "🙂", "\\u0000", "{{team}}"]


def hostile_text(max_size: int = 12) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(st.text(max_size=max_size), st.sampled_from(SPECIALS)),
                    max_size=5).map("".join)


NUMBERS = st.one_of(st.integers(), st.integers(min_value=2**63, max_value=10**40),
                    st.floats(allow_nan=True, allow_infinity=True))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, hostile_text())
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(hostile_text(8), inner, max_size=4)),
    max_leaves=12)
BIG = st.one_of(st.builds(Deep, st.sampled_from([33, 120, 250, 1000, 3000])),
                st.builds(Huge, st.sampled_from([100_001, 600_000])))


def mostly(valid: st.SearchStrategy[Any], *others: st.SearchStrategy[Any]
           ) -> st.SearchStrategy[Any]:
    """`valid` four times in five, else one of `others`. A drawn number picks
    the branch: Hypothesis explores one_of's later branches far more often
    than their share, so one_of cannot weigh them."""
    return st.integers(0, 4).flatmap(lambda i: valid if i < 4 else st.one_of(*others))


def _field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: valid (most often), hostile text, any JSON, or left out."""
    return mostly(valid, hostile_text(), JSON, st.just(_MISSING))


_MISSING = object()


def attachment() -> st.SearchStrategy[Any]:
    return st.one_of(st.fixed_dictionaries({
        "type": _field(st.sampled_from(["image_url", "image_base64"])),
        "url": _field(st.just("https://example.com/a.png")),
        "data": _field(st.just("aGVsbG8=")),
        "mime_type": _field(st.just("image/png")),
    }).map(lambda d: {k: v for k, v in d.items() if v is not _MISSING}), JSON)


def turn_payloads() -> st.SearchStrategy[dict[str, Any]]:
    """Each field valid about four times in five, so many turns pass the door."""
    return st.fixed_dictionaries({
        "conversation_id": _field(st.just(FRESH)),
        "user_id": _field(st.just("alice")),
        "message": mostly(st.just("hello"), hostile_text(200), JSON, st.just(_MISSING),
                          st.builds(Huge, st.just(150_000))),
        "service": mostly(st.sampled_from([_MISSING, "test"]), hostile_text(), JSON),
        "variables": mostly(st.just({"team": "qa"}), st.dictionaries(hostile_text(8), JSON,
                                                                      max_size=4),
                            JSON, st.builds(lambda b: {"v": b}, BIG), st.just(_MISSING)),
        "attachments": mostly(st.just(_MISSING), st.lists(attachment(), max_size=3), JSON),
    }).map(lambda d: {k: v for k, v in d.items() if v is not _MISSING})


def query_args() -> st.SearchStrategy[Any]:
    return st.one_of(JSON, st.builds(Deep, st.sampled_from([33, 250, 3000])),
                     st.builds(Huge, st.just(100_000)))


def json_text(value: Any) -> str:
    """`value` as JSON text; Deep and Huge written out, lone surrogates escaped."""
    if isinstance(value, Deep | Huge):
        return value.text()
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{json_text(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    return json.dumps(value)


def raw(value: Any) -> RawValue:
    return RawValue(Payload(metadata={"encoding": b"json/plain"},
                            data=json_text(value).encode()))


# Every documented error type a turn can end with (turnstile.engine.errors;
# docs/contract.md), plus the activity failure types a turn reports as its own.
def _error_types(cls: type[errors.TurnstileError]) -> set[str]:
    return {cls.error_type} | {t for sub in cls.__subclasses__() for t in _error_types(sub)}


DOCUMENTED = _error_types(errors.TurnstileError)
DOCUMENTED |= {"ToolExecutionError"}


@dataclass
class Figures:
    turns: int = 0
    endings: dict[str, int] = field(default_factory=dict)
    slowest: float = 0.0
    seconds: list[float] = field(default_factory=list)
    queries: int = 0
    refused_queries: int = 0

    def count(self, ending: str, seconds: float) -> None:
        self.turns += 1
        self.endings[ending] = self.endings.get(ending, 0) + 1
        self.slowest = max(self.slowest, seconds)
        self.seconds.append(seconds)


class HostileRig:
    """A worker on its own event loop and thread; `check` is called from any thread."""

    def __init__(self, address: str, database_url: str, llm: FakeOpenAIServer) -> None:
        self.address, self.database_url, self.llm = address, database_url, llm
        self.task_queue = f"hostile-{uuid.uuid4().hex[:8]}"
        self.db = Database(database_url)
        self.figures = Figures()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.client: Client | None = None
        self.turns: Turns | None = None
        self.started: list[str] = []  # workflow ids of the turns started

    def __enter__(self) -> HostileRig:
        self.llm.default = _answer
        self._thread.start()
        self._serving = asyncio.run_coroutine_threadsafe(self._serve(), self.loop)
        if not self._ready.wait(60):
            raise TimeoutError(f"the worker did not start: {self._serving}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._serving.result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.client = await Client.connect(self.address, data_converter=pydantic_data_converter)
        async with running_worker(self.client, self.task_queue, self.database_url,
                                  [make_service()], llm_url=self.llm.url) as turns:
            self.turns = turns
            self._ready.set()
            await self._stop.wait()

    def _run(self, work: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    def check(self, payload: dict[str, Any], arguments: list[Any]) -> None:
        self._run(self._check(payload, arguments), timeout=4 * ENDS_WITHIN)

    async def _check(self, payload: dict[str, Any], arguments: list[Any]) -> None:
        assert self.client is not None and self.turns is not None
        conversation = f"c-h-{uuid.uuid4().hex[:10]}"
        if payload.get("conversation_id") == FRESH:
            payload = {**payload, "conversation_id": conversation}
        wf_id = f"t-hostile-{uuid.uuid4().hex[:10]}"
        began = time.monotonic()
        handle: WorkflowHandle[Any, TurnResult] = await self.client.start_workflow(
            WORKFLOW_TYPE, raw(payload), id=wf_id, task_queue=self.task_queue,
            result_type=TurnResult)
        self.started.append(wf_id)
        result = await within(handle.result(), f"turn {wf_id}")
        took = time.monotonic() - began
        error = result.error
        ending = result.status.value + (f"/{error.type}" if error else "")
        self.figures.count(ending, took)
        assert result.status in TurnStatus, result
        if result.status != TurnStatus.COMPLETED:
            assert error is not None, result
            assert error.type != errors.UnexpectedError.error_type, (payload, error)
            assert error.type in DOCUMENTED, (payload, error)
        expected = _door(payload)
        if expected is not None:
            assert (result.status, error and error.type) == (
                TurnStatus.REFUSED, errors.InvalidTurnInput.error_type), (expected, result)
        history = await handle.fetch_history()
        failed = [e for e in history.events
                  if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
        assert not failed, (payload, failed[0].workflow_task_failed_event_attributes.failure)
        conv = payload.get("conversation_id")
        if isinstance(conv, str) and unsafe_text_at(conv) is None:  # else no store held it
            assert self._locks(conv) == 0, f"conversation {conv!r} still locked"
        await self._queries(handle, arguments)
        # The next turn on the conversation (this turn's own, when it had one) completes.
        user = payload.get("user_id")
        nxt = await within(self.turns.run(
            "hello again", conversation=conversation if conv == conversation else
            f"c-n-{uuid.uuid4().hex[:10]}",
            user=user if conv == conversation and expected is None and isinstance(user, str)
            else "alice"),
            "the next turn of the conversation")
        assert nxt.status == TurnStatus.COMPLETED, (payload, nxt.error)

    async def _queries(self, handle: WorkflowHandle[Any, Any], arguments: list[Any]) -> None:
        for name in ("status", "pending_approvals", "no-such-query"):
            for argument in arguments:
                self.figures.queries += 1
                try:
                    await within(handle.query(name, raw(argument)),
                                 f"query {name} of {handle.id}")
                except (WorkflowQueryFailedError, RPCError):
                    self.figures.refused_queries += 1  # refused at once: fine
        status = await within(handle.query("status"), f"status query of {handle.id}")
        assert isinstance(status, dict) and "step" in status, status

    def _locks(self, conversation: str) -> int:
        with self.db.connect() as conn:
            row = fetchone(conn, "SELECT COUNT(*) AS n FROM conversation_lock "
                                 "WHERE conversation_id = :c", {"c": conversation})
        return int(row["n"]) if row else 0


def _door(payload: dict[str, Any]) -> str | None:
    """Why the door must refuse `payload` (the product's rules, read here from
    outside), or None when it need not: a payload that does not decode into a
    TurnInput, or one that breaks a rule of turnstile.engine.turn_input_rules."""
    try:
        turn = TurnInput.model_validate_json(json_text(payload))
    except ValueError as err:
        return f"does not decode: {str(err)[:80]}"
    return turn_input_problem(turn)


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    """Every other turn calls `echo` once, then answers."""
    messages = request["messages"]
    if messages[-1].get("role") == "tool" or len(messages) % 2:
        return text_reply("done")
    return tool_reply((f"e{len(messages)}", "echo", {"text": "hi"}))
