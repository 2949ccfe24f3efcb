"""bench/model_requests.py: the recording proxy bench/real_model.py puts
between the worker and a local model server. The product's own provider
sends its requests (constrained as `constrain_tool_calls` sends them, plain,
streamed) through the proxy to the strict scripted server; each is recorded
with its wall seconds, the server's usage, tokens/s, whether it was
constrained and its finish_reason, and the answer reaches the provider
unchanged. What llama-cpp-python's server logs after a completion (llama.cpp's
perf lines) and llama-server's `timings` give the generation rate alone."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench import real_model
from bench.model_requests import RequestRecorder, requests_summary
from bench.real_model_checks import RunRecord
from turnstile.engine.messages import ChatMessage
from turnstile.engine.specs import ToolSpec
from turnstile.providers import ModelRequest, OpenAICompatibleProvider
from turnstile.testing import FakeOpenAIServer, text_reply

QUERY = ToolSpec(name="querySalesData", description="Sales over a period.",
                 parameters={"type": "object", "required": ["minAmount"],
                             "properties": {"minAmount": {"type": "number"}}})
USER = ChatMessage(role="user", content="Find customers whose sales last week exceeded 50,000")
# llama.cpp's perf print as llama-cpp-python 0.3.36's server writes it to its log.
PERF = ("llama_perf_context_print:        load time =     812.11 ms\n"
        "llama_perf_context_print: prompt eval time =   60250.00 ms /  1467 tokens "
        "(   41.07 ms per token,    24.35 tokens per second)\n"
        "llama_perf_context_print:        eval time =  100000.00 ms /    50 runs   "
        "( 2000.00 ms per token,     0.50 tokens per second)\n"
        "llama_perf_context_print:       total time =  160300.00 ms /  1517 tokens\n")


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


async def complete(url: str, request: ModelRequest) -> Any:
    provider = OpenAICompatibleProvider(url, model="m")
    try:
        return await provider.complete(request)
    finally:
        await provider.aclose()


async def test_each_request_is_recorded_with_usage_seconds_and_whether_constrained(
        fake: FakeOpenAIServer, tmp_path: Path) -> None:
    call = json.dumps({"tool_calls": [{"name": "querySalesData",
                                       "arguments": {"minAmount": 50000}}]})
    fake.script(text_reply(call),
        {**text_reply("8 customers."), "usage": {"prompt_tokens": 1467, "completion_tokens": 140}})
    with RequestRecorder(fake.url, bodies=tmp_path / "bodies") as proxy:
        first = await complete(proxy.url, ModelRequest(
            messages=[USER], tools=[QUERY], constrain_tool_calls=True, max_tokens=1024))
        second = await complete(proxy.url, ModelRequest(messages=[USER], tools=[QUERY]))
        records = proxy.take()
        assert proxy.take() == []
    # The answers reached the provider as the server wrote them (the
    # constrained one is read as calls after the provider, in the activity).
    assert first.message.content == call
    assert second.message.content == "8 customers."
    assert [r.seq for r in records] == [1, 2]
    constrained, plain = records
    assert constrained.constrained and constrained.tools == 0 and constrained.max_tokens == 1024
    assert not plain.constrained and plain.tools == 1
    assert (constrained.prompt_tokens, constrained.completion_tokens) == (10, 5)
    assert (plain.prompt_tokens, plain.completion_tokens) == (1467, 140)
    assert constrained.finish_reason == plain.finish_reason == "stop"
    assert all(r.finished and r.status == 200 and r.seconds > 0 for r in records)
    assert plain.tokens_per_second() == pytest.approx(140 / plain.seconds)
    assert plain.generation_tokens_per_second() is None  # the server gave no timings
    # The bodies as the worker sent them (what bench/constrained_speed.py sends again).
    sent = json.loads((tmp_path / "bodies" / "001.json").read_text())
    assert sent["response_format"]["type"] == "json_object"
    assert sent == {k: v for k, v in fake.requests[0].items() if not k.startswith("_")}
    row = dict(zip(["requests", "constrained", "unconstrained"],
                   requests_summary([r.as_dict() for r in records]), strict=False))
    assert row["requests"] == "2"
    assert row["constrained"].startswith("1: ") and row["unconstrained"].startswith("1: ")


async def test_the_generation_rate_comes_from_the_servers_log_or_its_timings(
        fake: FakeOpenAIServer, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("loading...\n" + PERF.replace("50 runs", "9 runs"))  # an earlier request

    def llama_cpp_python(request: dict[str, Any]) -> dict[str, Any]:
        with open(log, "a") as f:  # what its server logs before it answers: two completions
            f.write("Llama.generate: 1400 prefix-match hit, remaining 67 prompt tokens to eval\n"
                    + PERF.replace("60250.00", "250.00").replace("1467 tokens", "1 tokens")
                    .replace("100000.00", "10000.00").replace("50 runs", "5 runs")
                    + PERF.replace("60250.00", "60000.00").replace("1467 tokens", "1466 tokens")
                    .replace("100000.00", "90000.00").replace("50 runs", "45 runs"))
        return {**text_reply('{"answer": "8 customers."}'),
                "usage": {"prompt_tokens": 1467, "completion_tokens": 50}}

    timings = {"prompt_n": 67, "prompt_ms": 900.0, "predicted_n": 50, "predicted_ms": 7000.0}
    fake.script(llama_cpp_python, {**text_reply("done"), "timings": timings,
                                   "usage": {"prompt_tokens": 1467, "completion_tokens": 50}})
    used = iter([100.0, 130.0, 130.0, 131.0])  # the server's CPU seconds, read twice a request
    with RequestRecorder(fake.url, log=log, cpu=lambda: next(used)) as proxy:
        await complete(proxy.url, ModelRequest(messages=[USER], tools=[QUERY],
                                               constrain_tool_calls=True))
        await complete(proxy.url, ModelRequest(messages=[USER]))
        logged, timed = proxy.take()
    assert (logged.prompt_evaluated, logged.prompt_seconds) == (1467, 60.25)
    assert (logged.generated, logged.generation_seconds) == (50, 100.0)
    assert logged.generation_tokens_per_second() == 0.5
    assert logged.server_cpu_seconds == 30.0 and timed.server_cpu_seconds == 1.0
    assert logged.load_average is not None
    # The fake answered at once: the server's own timings exceed the wall time,
    # so nothing is left besides them.
    assert logged.other_seconds() == 0.0
    assert logged.as_dict()["server_cpu_share"] == round(30 / logged.seconds, 3)
    assert (timed.prompt_evaluated, timed.generated, timed.generation_seconds) == (67, 50, 7.0)
    assert timed.generation_tokens_per_second() == pytest.approx(50 / 7)
    row = requests_summary([logged.as_dict(), timed.as_dict()])
    assert "0.50 generating" in row[1] and "7.14 generating" in row[2]


async def test_a_streamed_answer_is_passed_through_and_its_usage_read(
        fake: FakeOpenAIServer) -> None:
    fake.script({**text_reply("streamed answer"),
                 "usage": {"prompt_tokens": 300, "completion_tokens": 12}})
    with RequestRecorder(fake.url) as proxy:
        provider = OpenAICompatibleProvider(proxy.url, model="m")
        pieces: list[str] = []
        try:
            async def on_delta(text: str) -> None:
                pieces.append(text)
            response = await provider.stream(ModelRequest(messages=[USER]), on_delta)
        finally:
            await provider.aclose()
        (record,) = proxy.take()
    assert response.message.content == "streamed answer" == "".join(pieces)
    assert (record.prompt_tokens, record.completion_tokens) == (300, 12)
    assert record.finish_reason == "stop" and record.finished


def test_a_request_still_unanswered_is_taken_as_it_stands_and_only_once(
        fake: FakeOpenAIServer) -> None:
    release = threading.Event()

    def slow(request: dict[str, Any]) -> dict[str, Any]:
        release.wait(10)
        return text_reply("late")

    fake.script(slow)
    with RequestRecorder(fake.url) as proxy:
        sender = threading.Thread(target=lambda: httpx.post(
            f"{proxy.url}/chat/completions", json={"messages": [{"role": "user",
                                                                 "content": "hi"}]},
            timeout=20))
        sender.start()
        deadline = time.monotonic() + 10
        while not proxy.records and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        (waiting,) = proxy.take()
        release.set()
        sender.join(10)
        assert proxy.take() == []  # its answer came later: not a request of the next run
    assert not waiting.finished and waiting.status is None and waiting.seconds >= 0.3
    assert waiting.error == "no answer yet"
    row = requests_summary([waiting.as_dict()])
    assert row[3].endswith("unanswered") and row[5] == "1" and row[6] == "-"
    assert waiting.other_seconds() is None


def test_records_kept_before_requests_were_recorded_still_load() -> None:
    old: dict[str, Any] = {
        "server": "s", "run": 1, "ending": "completed", "seconds": 1.0, "rounds": 1,
        "calls": [], "query_args_right": None, "query_args": None, "mails": 0,
        "mail_to_ops": False, "customers_named": 0, "customers_expected": 8,
        "max_model_attempts": 1, "answer": "", "replies": []}
    record = RunRecord(**old)
    assert record.requests == []
    assert requests_summary(record.requests)[1] == "not recorded"


def test_the_table_reads_kept_runs_and_passes_over_other_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    record = RunRecord(server="x", run=1, ending="completed", seconds=9.0, rounds=2, calls=[],
                       query_args_right=True, query_args=None, mails=1, mail_to_ops=True,
                       customers_named=8, customers_expected=8, max_model_attempts=1, answer="")
    record.requests = [{"seq": 1, "constrained": True, "seconds": 100.0, "finished": True,
                        "prompt_tokens": 547, "completion_tokens": 63, "finish_reason": "stop",
                        "tokens_per_second": 0.63, "generation_tokens_per_second": 0.7,
                        "server_cpu_share": 0.35}]
    runs, other = tmp_path / "runs.json", tmp_path / "constrained-speed.json"
    runs.write_text(json.dumps([record.as_dict()]))
    other.write_text(json.dumps({"bench": "bench.constrained_speed", "requests": []}))
    monkeypatch.setattr("sys.argv", ["real_model", "--table", str(runs), str(other)])
    real_model.main()
    out = capsys.readouterr().out
    assert "runs | 1 | 1/1" in out
    assert ("runs | 1 | 1: 0.63 tok/s wall, 0.70 generating | none | 100 s: 547 prompt, "
            "63 completion tokens (constrained) | stop 1 | 0 | 0.35") in out
    assert "not runs, passed over: constrained-speed.json" in out
