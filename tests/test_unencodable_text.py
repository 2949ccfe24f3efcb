"""Property: text that cannot be encoded never hangs a turn.

A lone surrogate ("\\ud800") cannot be serialized into a Temporal payload and
NUL cannot be stored in PostgreSQL text; a workflow task that fails on such
text is retried forever while the turn holds its conversation. Hypothesis
builds model responses that carry them — in the answer, in tool-call ids and
names, in tool arguments (escaped once: a raw character in the arguments
text; escaped twice: a value the tool's JSON decoding produces) — next to
oversized numbers and deeply nested JSON. Every turn must close within
seconds with a defined status and no workflow-task failure, and the next turn
of its conversation must run, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from temporalio.api.enums.v1 import EventType

from tests.support.loop_thread import LoopThread, hosted_worker
from tests.support.services import add, echo
from tests.support.temporal_server import DevServer
from tests.support.turns import Turns
from turnstile.engine.contract import TurnStatus
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, RawReply, text_reply

EXAMPLES = 12  # per database: each is two real turns

# JSON escapes of text nobody can store or serialize as is.
BAD = [r"\ud800", r"\udfff", r"\udc00x", r"\u0000", r"a\u0000b", r"\ud83d"]
HOLE = "@@HOLE@@"


def _body(kind: str) -> dict[str, Any]:
    def calls(cid: str, name: str, args: str) -> dict[str, Any]:
        return {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": name,
                                                             "arguments": args}}]}}]}
    if kind == "answer":
        return {"choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": f"total: {HOLE} done"}}]}
    if kind == "call id":
        return calls(f"call_{HOLE}", "add", '{"a": 1, "b": 2}')
    if kind == "tool name":
        return calls("call_0", f"ec{HOLE}ho", '{"text": "x"}')
    if kind == "raw argument":  # a raw character in the arguments text
        return calls("call_0", "echo", '{"text": "' + HOLE + '"}')
    if kind == "decoded argument":  # a value json.loads of the arguments produces
        return calls("call_0", "echo", '{"text": "' + HOLE + HOLE + '"}')
    if kind == "oversized number":
        return calls("call_0", "add", '{"a": 1' + "0" * 400 + ', "b": 1e999999}')
    assert kind == "deep json"
    return calls("call_0", "echo", '{"text": ' + "[" * 3000 + "]" * 3000 + "}")


def hostile(kind: str, bad: str) -> RawReply:
    text = json.dumps(_body(kind))
    if kind == "decoded argument":  # escaped twice: the hole is inside a JSON string
        text = text.replace(HOLE + HOLE, bad.replace("\\", "\\\\"))
    return RawReply(200, text.replace(HOLE, bad))


KINDS = ["answer", "call id", "tool name", "raw argument", "decoded argument",
         "oversized number", "deep json"]


@pytest.fixture
def harness(temporal_server: DevServer, db: Database, fake_llm: FakeOpenAIServer) -> Iterator[
        tuple[LoopThread, Turns, dict[str, RawReply]]]:
    cases: dict[str, RawReply] = {}

    def reply(request: dict[str, Any]) -> Any:
        msgs = request["messages"]
        user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        content = msgs[user]["content"]
        if content not in cases or any(m["role"] == "tool" for m in msgs[user:]):
            return text_reply("done")
        return cases[content]

    fake_llm.default = reply
    service = Service(name="text", tools=ToolRegistry([add, echo]))
    with hosted_worker(temporal_server.address, f"text-{uuid.uuid4().hex[:8]}", db.url,
                       [service], llm_url=fake_llm.url) as (lt, turns):
        yield lt, turns, cases


def test_unencodable_text_never_hangs_a_turn(harness, db: Database) -> None:  # type: ignore[no-untyped-def]
    lt, turns, cases = harness
    seen: set[str] = set()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(kind=st.sampled_from(KINDS), bad=st.sampled_from(BAD))
    def one(kind: str, bad: str) -> None:
        key = f"case-{uuid.uuid4().hex}"
        cases[key] = hostile(kind, bad)
        seen.add(kind)

        async def two_turns() -> tuple[Any, list[Any], Any]:
            handle = await turns.start(key, service="text", conversation=key)
            try:
                result = await asyncio.wait_for(handle.result(), 20)
            except TimeoutError:
                await handle.terminate("test: the turn hung")
                raise AssertionError(f"{kind} {bad}: the turn did not close") from None
            history = await handle.fetch_history()
            after = await turns.run("and now?", service="text", conversation=key)
            return result, [e.event_type for e in history.events], after

        result, events, after = lt.run(two_turns(), timeout=60)
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events, (kind, bad)
        assert result.status in {TurnStatus.COMPLETED, TurnStatus.FAILED}, (kind, bad, result)
        assert after.status == TurnStatus.COMPLETED, (kind, bad, after.error)
        stored = MemoryStore(db).messages(key)
        for m in stored:  # nothing unencodable reached the database
            for text in [m.content or "", *(c.arguments + c.id + c.name for c in m.tool_calls)]:
                text.encode("utf-8")
                assert "\x00" not in text

    one()
    assert len(seen) >= 5  # the generator reached most kinds
