"""The httpx provider against a fake OpenAI-compatible server on a real socket."""

from __future__ import annotations

import time

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.engine.contract import TurnStatus
from turnstile.testing import FakeOpenAIServer, RawReply, text_reply, tool_reply


def _stamp(reply):  # type: ignore[no-untyped-def]
    """Record when the server received the request."""
    def answer(request):  # type: ignore[no-untyped-def]
        request["_at"] = time.monotonic()
        return reply
    return answer


async def test_429_retry_after_is_honoured_by_temporal(client: Client, task_queue: str, tmp_path,
                                                       fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(
        _stamp(RawReply(429, '{"error": "slow down"}', {"Retry-After": "2"})),
        _stamp(tool_reply(("c1", "add", {"a": 1, "b": 1}))),
        _stamp(text_reply("2")),
    )
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("1+1?")
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "2"
    gap = fake_llm.requests[1]["_at"] - fake_llm.requests[0]["_at"]
    assert gap >= 1.9, f"retried after {gap:.2f} s, Retry-After said 2 s"
    # The retry is Temporal's: the first model activity completed on attempt 2.
    history = await handle.fetch_history()
    started = [e.activity_task_started_event_attributes.attempt for e in history.events
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert 2 in started


async def test_400_is_not_retried_and_fails_the_turn_clearly(client: Client, task_queue: str,
                                                             tmp_path,
                                                             fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(RawReply(400, '{"error": {"message": "unknown parameter: tools"}}'))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("hello")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None
    assert result.error.type == "ModelRequestRejected"
    assert "400" in result.error.message and "unknown parameter" in result.error.message
    assert len(fake_llm.requests) == 1


async def test_malformed_completion_is_a_typed_error(client: Client, task_queue: str, tmp_path,
                                                     fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script({"choices": []})
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("hello")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "MalformedModelResponse"


async def test_api_key_is_sent_as_bearer(client: Client, task_queue: str, tmp_path,
                                         fake_llm: FakeOpenAIServer, monkeypatch) -> None:
    from turnstile.activities import Runtime  # noqa: F401 - imported for the settings path below
    from turnstile.providers import OpenAICompatibleProvider

    provider = OpenAICompatibleProvider(fake_llm.url, api_key="sk-test", model="m-1")
    fake_llm.script(text_reply("hi"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], provider=provider) as turns:
        result = await turns.run("hello")
    assert result.status == TurnStatus.COMPLETED
    assert fake_llm.requests[0]["_auth"] == "Bearer sk-test"
    assert fake_llm.requests[0]["model"] == "m-1"
    assert fake_llm.requests[0]["_path"] == "/v1/chat/completions"


def test_the_fake_server_refuses_a_body_real_endpoints_cannot_read(
        fake_llm: FakeOpenAIServer) -> None:
    """The scripted server reads a body as OpenAI's and llama-server's do:
    declared `application/json` and strict JSON (no NaN); the provider's
    requests are read (every turn test), these are refused with a 400."""
    import httpx

    fake_llm.default = lambda _req: text_reply("ok")
    url = f"{fake_llm.url}/chat/completions"
    good = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    assert httpx.post(url, content=good,
                      headers={"Content-Type": "application/json"}).status_code == 200
    untyped = httpx.post(url, content=good, headers={"Content-Type": "text/plain"})
    assert untyped.status_code == 400 and "Content-Type" in untyped.text
    nan = httpx.post(url, content=good[:-1] + b',"temperature":NaN}',
                     headers={"Content-Type": "application/json"})
    assert nan.status_code == 400 and "JSON body" in nan.text
    assert len(fake_llm.refusals) == 2
