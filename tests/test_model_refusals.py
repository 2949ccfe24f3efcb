"""A deterministic 5xx ends the turn fast; a server that is away is waited
for (activities/model_refusals.py, docs/errors.md). Real turns
against the scripted server, with the model call's retry policy as it is
(1 s, then doubling)."""

from __future__ import annotations

import asyncio
import json
import time

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.activities.model_refusals import MODEL_REFUSAL_LIMIT, carried, counted
from turnstile.engine.contract import TurnStatus
from turnstile.providers.openai_compat import answer_fingerprint, says_invalid_request
from turnstile.testing import FakeOpenAIServer, RawReply, text_reply
from turnstile.testing.openai_server import llama_cpp_python_validation_error
from turnstile.testing.processes import free_port


def test_what_counts_as_an_invalid_request_answer() -> None:
    assert says_invalid_request(llama_cpp_python_validation_error(3))
    assert says_invalid_request('{"error": {"type": "invalid_request_error"}}')
    assert says_invalid_request("failed to parse grammar")
    assert not says_invalid_request("<html><h1>502 Bad Gateway</h1></html>")
    assert not says_invalid_request('{"error": {"message": "Loading model", "code": 503}}')
    # Identical but for ids and numbers: the same answer.
    assert answer_fingerprint(500, "bad field at 3, request id 9f3a1c2b77e0") == \
        answer_fingerprint(500, "bad  field at 4, request id 0b1c2d3e4f5a")
    assert answer_fingerprint(500, "bad field") != answer_fingerprint(502, "bad field")
    assert answer_fingerprint(500, "field required") != answer_fingerprint(500, "bad field")


def test_the_count_runs_only_over_identical_answers_in_a_row() -> None:
    assert carried([]) == {} and carried([None]) == {} and carried([{"count": "x"}]) == {}
    previous = carried([{"refusal": "f1", "count": 2}])
    assert counted(previous, "f1") == 3 and counted(previous, "f2") == 1
    assert counted({}, "f1") == 1


async def test_an_identical_validation_500_ends_the_turn_within_seconds(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = RawReply(500, llama_cpp_python_validation_error(1))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        began = time.monotonic()
        handle = await turns.start("hello")
        result = await handle.result()
        took = time.monotonic() - began
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "ModelServerRefused"
    assert "Input should be a valid string" in result.error.message
    assert f"{MODEL_REFUSAL_LIMIT} times" in result.error.message
    assert len(fake_llm.requests) == MODEL_REFUSAL_LIMIT
    assert took < 15, f"took {took:.1f} s"
    history = await handle.fetch_history()
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert max(attempts) == MODEL_REFUSAL_LIMIT


async def test_answers_that_differ_or_say_the_server_is_away_are_retried(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    invalid_a = RawReply(500, llama_cpp_python_validation_error(1))
    invalid_b = RawReply(500,
                         json.dumps({"error": {"message": "1 validation error: field required"}}))
    away = RawReply(503, json.dumps({"error": {"message": "Service Unavailable"}}))
    # a, a, b: never three alike in a row; 503s however many: an outage.
    fake_llm.script(invalid_a, invalid_a, invalid_b, text_reply("first"),
                    *[away] * MODEL_REFUSAL_LIMIT, text_reply("second"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        first = await turns.run("hello", conversation="c-a")
        second = await turns.run("hello", conversation="c-b")
    assert (first.status, first.answer) == (TurnStatus.COMPLETED, "first"), first.error
    assert (second.status, second.answer) == (TurnStatus.COMPLETED, "second"), second.error
    assert len(fake_llm.requests) == 5 + MODEL_REFUSAL_LIMIT


async def test_a_server_that_went_away_is_waited_for(client: Client, task_queue: str,
                                                     tmp_path) -> None:
    port = free_port()  # nothing listens: every attempt's connection is refused
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=f"http://127.0.0.1:{port}/v1") as turns:
        handle = await turns.start("hello")
        for _ in range(200):  # until more attempts failed than the refusal limit allows
            desc = await handle.describe()
            pending = desc.raw_description.pending_activities
            if pending and pending[0].attempt > MODEL_REFUSAL_LIMIT:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the model call was not retried")
        server = FakeOpenAIServer(port=port)
        try:
            server.script(text_reply("back"))
            result = await handle.result()
        finally:
            server.close()
    assert (result.status, result.answer) == (TurnStatus.COMPLETED, "back"), result.error
