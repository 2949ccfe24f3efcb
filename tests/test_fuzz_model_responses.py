"""Property: whatever a model sends back, the turn ends in a defined state.

Hypothesis generates malformed or hostile model responses (bad JSON, wrong
types, unknown tools, huge arguments, empty names, duplicate call ids, 4xx
statuses).

- 500 of them go through the pure path without a server: the provider's
  parser either reads a response or says it is malformed, and the tool
  loop's rules (turnstile.engine.tool_round_rules) reach a decision for
  every call it contains.
- 100 (the generation is derandomized; a share of them ask for tools with
  hostile names, ids and arguments) each drive one real turn on the dev
  server through the HTTP provider. Asserted for every one: the
  turn returns a result with a known status, and its history holds no
  workflow-task failure (which would mean the workflow code itself crashed
  and would retry forever); the turn's re-ask of an empty answer gets the
  same response again, and no turn ends `ModelUnavailable` (the scripted
  model failing, not the response under test).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st
from temporalio.api.enums.v1 import EventType

from tests.support.loop_thread import LoopThread, hosted_worker
from tests.support.services import add, echo, mustSucceed, refuses, reserve, unlock
from tests.support.temporal_server import DevServer
from tests.support.turns import Turns
from turnstile.engine.breakers import Breakers
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.errors import MalformedModelResponse, TurnstileError
from turnstile.engine.specs import LoopPolicy
from turnstile.engine.tool_round_rules import Execute, Settle, before_call, round_stop
from turnstile.engine.turn_rules import FinalAnswer, RunTools, next_step, parsed_arguments
from turnstile.providers.openai_compat import parse_completion
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.testing import FakeOpenAIServer, RawReply, text_reply

PURE_EXAMPLES = 500
TURN_EXAMPLES = 100
REAL = ["add", "echo", "refuses", "unlock", "reserve", "mustSucceed"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=10)

names = st.sampled_from(REAL) | st.sampled_from(["", " ", "nope", "add ", "ADD", "x" * 300]) \
    | st.text(max_size=30)
arguments = st.one_of(
    json_values.map(json.dumps),  # any JSON: often not an object, often wrong fields
    st.text(max_size=50),  # not JSON at all
    st.fixed_dictionaries({"a": st.integers(-5, 5), "b": st.integers(-5, 5)}).map(json.dumps),
    st.fixed_dictionaries({"text": st.text(max_size=10)}).map(json.dumps),
    st.integers(1_000, 200_000).map(lambda n: json.dumps({"text": "y" * n})),  # huge
    st.just("{}"),
)
call_ids = st.sampled_from(["", "dup", "dup", "c1"]) | st.text(max_size=12)
tool_call = st.fixed_dictionaries({
    "id": call_ids, "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": names, "arguments": arguments}),
}) | json_values  # sometimes not a call object at all

completion = st.fixed_dictionaries({
    "choices": st.lists(st.fixed_dictionaries({
        "message": st.fixed_dictionaries({
            "role": st.just("assistant"),
            "content": st.none() | st.text(max_size=40) | st.integers(),
            "tool_calls": st.none() | st.lists(tool_call, max_size=4) | json_values,
        }),
        "finish_reason": st.sampled_from(["stop", "tool_calls", None]),
    }), max_size=2),
    "usage": st.none() | st.fixed_dictionaries({"prompt_tokens": st.integers(0, 9)}),
})

responses = st.one_of(
    completion.map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=80),  # not JSON
    st.just(""),
).map(lambda body: RawReply(200, body)) | st.builds(
    RawReply, st.sampled_from([400, 401, 404, 413, 422]), st.text(max_size=40))


# Responses that do ask for tools (hostile names, ids and arguments), so the
# loop's decisions are exercised on every example, not the few percent of
# `responses` that parse to tool calls.
tool_responses = st.lists(st.fixed_dictionaries({
    "id": call_ids, "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": names, "arguments": arguments}),
}), min_size=1, max_size=4).map(lambda calls: RawReply(200, json.dumps(
    {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": calls}}]})))




@pytest.fixture
def fuzz_turns(temporal_server: DevServer, tmp_path, fake_llm: FakeOpenAIServer) -> Iterator[
        tuple[LoopThread, Turns, dict[str, RawReply]]]:
    cases: dict[str, RawReply] = {}

    def reply(request: dict[str, Any]) -> Any:
        msgs = request["messages"]
        # The turn's own message: a nudge the turn adds after it (the re-ask
        # of an empty answer) is asked the same drawn response again.
        user = max(i for i, m in enumerate(msgs) if m["role"] == "user"
                   and isinstance(m["content"], str) and m["content"] in cases)
        if any(m["role"] == "tool" for m in msgs[user:]):
            return text_reply("done")  # after any tool result, the model gives up politely
        return cases[msgs[user]["content"]]

    fake_llm.default = reply
    service = Service(
        name="fuzz", tools=ToolRegistry([add, echo, refuses, unlock, reserve, mustSucceed]),
        loop=LoopPolicy(model_retry_window_seconds=30))
    with hosted_worker(temporal_server.address, f"fuzz-{uuid.uuid4().hex[:8]}",
                       f"sqlite:///{tmp_path}/fuzz.db", [service],
                       llm_url=fake_llm.url) as (lt, turns):
        yield lt, turns, cases


DEFINED = {TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.ROLLED_BACK,
           TurnStatus.COMPENSATION_FAILED}


def test_any_model_response_ends_in_a_defined_state(fuzz_turns) -> None:  # type: ignore[no-untyped-def]
    lt, turns, cases = fuzz_turns
    seen_statuses: set[TurnStatus] = set()

    @settings(max_examples=TURN_EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(response=responses | tool_responses)
    def one(response: RawReply) -> None:
        key = f"case-{uuid.uuid4().hex}"
        cases[key] = response

        async def turn() -> tuple[Any, list[Any]]:
            handle = await turns.start(key, service="fuzz", conversation=key)
            result = await handle.result()
            history = await handle.fetch_history()
            return result, [e.event_type for e in history.events]

        result, events = lt.run(turn(), timeout=60)
        assert result.status in DEFINED, result
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events
        if result.status != TurnStatus.COMPLETED:
            assert result.error is not None and result.error.type and result.error.message
            # Every drawn response was answered: unreachable means the scripted
            # model itself failed (its reply raised), not the response under test.
            assert result.error.type != "ModelUnavailable", result.error
        seen_statuses.add(result.status)

    one()
    # The generator really reached both ends: turns that completed and turns that failed.
    assert {TurnStatus.COMPLETED, TurnStatus.FAILED} <= seen_statuses

FUZZ_SERVICE = Service(name="fuzz", tools=ToolRegistry([add, echo, refuses, unlock, reserve,
                                                         mustSucceed]))


@settings(max_examples=PURE_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(response=responses | tool_responses)
def test_any_model_response_is_read_or_refused_and_every_call_decided(response: RawReply) -> None:
    if response.status >= 400:
        return  # refused by status before the body is read (test_model_provider.py)
    try:
        body = json.loads(response.body)
        message = parse_completion(body).message
    except (ValueError, MalformedModelResponse):
        event("malformed")
        return  # the provider reports a malformed response: the turn fails with its type
    spec = FUZZ_SERVICE.spec()
    step = next_step(message)
    if isinstance(step, FinalAnswer):
        event("answer")
        assert isinstance(step.text, str)
        return
    event("tool calls")
    assert isinstance(step, RunTools) and step.calls
    known = [t.name for t in spec.tools]
    stop = round_stop(1, [c.name for c in step.calls], spec.loop, Breakers(spec.loop.breakers))
    assert stop is None or isinstance(stop, TurnstileError)
    for call in step.calls:
        parsed_arguments(call.arguments)  # what the turn records never raises
        tool = spec.tool(call.name)
        decision = before_call(call.name, tool, known, False, spec.loop)
        assert isinstance(decision, Execute | Settle)
        event("unknown tool" if tool is None else "known tool")
        if tool is None:
            assert isinstance(decision, Settle) and decision.status is CallStatus.UNKNOWN_TOOL
            assert repr(call.name) in decision.text
        else:
            assert decision == Execute(needs_approval=tool.requires_approval)
