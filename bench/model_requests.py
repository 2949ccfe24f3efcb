"""What each model request of a bench run cost on the server: a recording
proxy between the worker and a local model server.

    proxy = RequestRecorder(server.url, log=server.log, bodies=DIR)  # LLM_BASE_URL=proxy.url
    ... a turn ...
    proxy.take()   # [RequestRecord, ...] since the last take, in order

Every request is forwarded unchanged (body, headers, a streamed answer as it
comes); a `POST .../chat/completions` is recorded: its wall seconds (request
sent to answer read), whether it was constrained (a `response_format` with a
schema, as `constrain_tool_calls` sends), the size of what it sent, and from
the answer the server's `usage` (prompt and completion tokens) and
`finish_reason`. Where the server says how long it read the prompt and how
long it generated, that is kept too: llama-server's `timings` in the answer,
or the `prompt eval time` / `eval time` lines llama.cpp's perf print writes to
the server's log after each completion (llama-cpp-python's server, verbose by
default). So a slow request shows what was slow: reading the prompt, or
generating, and at how many tokens/s.

`bodies` keeps each recorded request's body as it was sent (NNN.json), to
send the same request again (bench/constrained_speed.py).

A request still unanswered when `take()` is called (a turn cancelled at its
limit) is returned as it stands (`finished` False, its seconds so far) and not
again when it ends.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from bench.bench_support import free_port

# llama.cpp's perf print (llama_perf_context_print), as both servers log it:
#   "prompt eval time =     812.30 ms /   104 tokens (...)"
#   "       eval time =   20371.02 ms /    63 runs   (...)"
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) (?:runs|tokens)")
# Headers the proxy sets itself.
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
        "host"}


@dataclass
class RequestRecord:
    """One chat-completions request as the server answered it."""

    seq: int  # 1, 2, ... over the proxy's life
    constrained: bool  # a response_format carrying a JSON schema
    tools: int  # tools offered
    messages: int
    request_bytes: int
    max_tokens: int | None
    seconds: float = 0.0  # wall: sent to answer read (so far, when not finished)
    finished: bool = False
    status: int | None = None  # HTTP status; None: no answer
    prompt_tokens: int | None = None  # the server's usage
    completion_tokens: int | None = None
    finish_reason: str | None = None
    # The server's own timings (llama-server's `timings`, or its perf log):
    prompt_evaluated: int | None = None  # prompt tokens it read (the rest came from its cache)
    prompt_seconds: float | None = None
    generated: int | None = None  # tokens it generated
    generation_seconds: float | None = None
    # CPU seconds the server process used meanwhile (all its threads), and the
    # machine's 1-minute load average when it was sent: on a shared machine,
    # how much of the CPU the server got.
    server_cpu_seconds: float | None = None
    load_average: float | None = None
    error: str = ""
    began: float = field(default=0.0, repr=False)  # monotonic, for the seconds so far
    cpu_began: float | None = field(default=None, repr=False)
    taken: bool = field(default=False, repr=False)

    def tokens_per_second(self) -> float | None:
        """Completion tokens per wall second (prompt reading included)."""
        if not self.completion_tokens or self.seconds <= 0:
            return None
        return self.completion_tokens / self.seconds

    def generation_tokens_per_second(self) -> float | None:
        """Tokens per second of generation alone, by the server's timings."""
        if not self.generated or not self.generation_seconds:
            return None
        return self.generated / self.generation_seconds

    def other_seconds(self) -> float | None:
        """Wall seconds outside the server's prompt reading and decoding:
        sampling (a grammar included), the chat template, the HTTP round."""
        if self.prompt_seconds is None or self.generation_seconds is None or not self.finished:
            return None
        return max(0.0, self.seconds - self.prompt_seconds - self.generation_seconds)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items()
               if k not in ("began", "taken", "cpu_began")}
        out["seconds"] = round(self.seconds, 2)
        other = self.other_seconds()
        out["other_seconds"] = None if other is None else round(other, 2)
        cpu = self.server_cpu_seconds
        out["server_cpu_seconds"] = None if cpu is None else round(cpu, 2)
        # CPU seconds per wall second: up to the server's threads when it had the cores.
        out["server_cpu_share"] = (None if cpu is None or self.seconds <= 0
                                   else round(cpu / self.seconds, 3))
        for key, rate in (("tokens_per_second", self.tokens_per_second()),
                          ("generation_tokens_per_second", self.generation_tokens_per_second())):
            out[key] = None if rate is None else round(rate, 3)
        for key in ("prompt_seconds", "generation_seconds"):
            if out[key] is not None:
                out[key] = round(out[key], 2)
        return out


def is_constrained(body: dict[str, Any]) -> bool:
    """A `response_format` with a schema: `{"type": "json_object", "schema": ...}`
    (what `constrain_tool_calls` sends) or OpenAI's `json_schema` form."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return False
    return bool(fmt.get("schema")) or fmt.get("type") == "json_schema"


def record_for(seq: int, body: dict[str, Any], size: int,
               cpu: float | None = None) -> RequestRecord:
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    return RequestRecord(
        seq=seq, constrained=is_constrained(body), tools=len(body.get("tools") or []),
        messages=len(body.get("messages") or []), request_bytes=size,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        load_average=round(os.getloadavg()[0], 2), began=time.monotonic(), cpu_began=cpu)


def read_answer(record: RequestRecord, answer: dict[str, Any]) -> None:
    """usage, finish_reason and llama-server's `timings` of a completion body
    (or of a streamed chunk)."""
    usage = answer.get("usage")
    if isinstance(usage, dict):
        record.prompt_tokens = usage.get("prompt_tokens", record.prompt_tokens)
        record.completion_tokens = usage.get("completion_tokens", record.completion_tokens)
    for choice in answer.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
    timings = answer.get("timings")
    if isinstance(timings, dict) and "predicted_ms" in timings:
        record.prompt_evaluated = timings.get("prompt_n")
        record.prompt_seconds = float(timings.get("prompt_ms") or 0) / 1000
        record.generated = timings.get("predicted_n")
        record.generation_seconds = float(timings.get("predicted_ms") or 0) / 1000


def read_perf_log(record: RequestRecord, text: str) -> None:
    """The `prompt eval time` / `eval time` lines in `text` (what the server
    logged while answering), summed, where the answer had no timings: with
    `tools`, llama-cpp-python's `chatml-function-calling` answers one request
    with several completions (a constrained first step, then the call's
    arguments), each logging its own pair."""
    if record.generation_seconds is not None:
        return
    prompts, evals = _PROMPT_EVAL.findall(text), _EVAL.findall(text)
    if prompts:
        record.prompt_seconds = sum(float(ms) for ms, _ in prompts) / 1000
        record.prompt_evaluated = sum(int(n) for _, n in prompts)
    if evals:
        record.generation_seconds = sum(float(ms) for ms, _ in evals) / 1000
        record.generated = sum(int(n) for _, n in evals)


class RequestRecorder:
    """The proxy (module docstring): `url` is the base URL to give the worker
    (…/v1, as the upstream's); `log` is the upstream server's log file, read
    for its perf lines; `cpu` reads the server process's CPU seconds so far
    (None when it cannot)."""

    def __init__(self, upstream: str, log: Path | None = None,
                 bodies: Path | None = None,
                 cpu: Callable[[], float | None] | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.log = log
        self.cpu = cpu
        self.bodies = bodies  # each recorded request's body, as NNN.json (None: not kept)
        self.records: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._seq = 0
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection: no framing to keep
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                recorder._forward(self, b"")

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("content-length") or 0)
                recorder._forward(self, self.rfile.read(length))

        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        prefix = httpx.URL(self.upstream).path.rstrip("/")
        self.url = f"http://127.0.0.1:{self.port}{prefix}"
        self._upstream_root = self.upstream[: len(self.upstream) - len(prefix)]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> RequestRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def take(self) -> list[RequestRecord]:
        """The requests since the last take, in order; one still unanswered is
        returned as it stands and not again."""
        now = time.monotonic()
        with self._lock:
            out = []
            for r in self.records:
                if r.taken:
                    continue
                r.taken = True
                if not r.finished:
                    r = RequestRecord(**{**asdict(r), "seconds": now - r.began})
                    r.server_cpu_seconds = self._cpu_since(r)
                    r.error = r.error or "no answer yet"
                out.append(r)
            self.records = [r for r in self.records if not r.finished]
            return out

    def _cpu_now(self) -> float | None:
        return None if self.cpu is None else self.cpu()

    def _cpu_since(self, record: RequestRecord) -> float | None:
        now = self._cpu_now()
        if now is None or record.cpu_began is None or now < record.cpu_began:
            return None  # no server, or a restarted one
        return now - record.cpu_began

    def _log_size(self) -> int:
        return self.log.stat().st_size if self.log is not None and self.log.exists() else 0

    def _log_since(self, offset: int) -> str:
        if self.log is None or not self.log.exists():
            return ""
        with open(self.log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def _forward(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        record: RequestRecord | None = None
        if handler.command == "POST" and handler.path.rstrip("/").endswith("/chat/completions"):
            try:
                body = json.loads(raw)
            except ValueError:
                body = {}
            with self._lock:
                self._seq += 1
                record = record_for(self._seq, body if isinstance(body, dict) else {}, len(raw),
                                    self._cpu_now())
                self.records.append(record)
            if self.bodies is not None:
                self.bodies.mkdir(parents=True, exist_ok=True)
                (self.bodies / f"{record.seq:03d}.json").write_bytes(raw)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
        offset = self._log_size()
        try:
            with httpx.Client(timeout=None) as client, client.stream(
                    handler.command, self._upstream_root + handler.path, content=raw,
                    headers=headers) as resp:
                streamed = resp.headers.get("content-type", "").startswith("text/event-stream")
                handler.send_response(resp.status_code)
                for k, v in resp.headers.items():
                    if k.lower() not in _HOP:
                        handler.send_header(k, v)
                if not streamed:
                    data = resp.read()
                    handler.send_header("content-length", str(len(data)))
                    handler.end_headers()
                    self._answered(record, resp.status_code, data, offset)
                    handler.wfile.write(data)
                    return
                handler.end_headers()
                # Each piece as it comes, but the last (with `[DONE]`) only once
                # the request is recorded: a client that stops reading at
                # `[DONE]` finds it in the next take().
                events, held = b"", b""
                for chunk in resp.iter_raw():
                    events += chunk
                    if held:
                        handler.wfile.write(held)
                        handler.wfile.flush()
                    held = chunk
                self._answered(record, resp.status_code, b"", offset, events)
                handler.wfile.write(held)
        except httpx.HTTPError as exc:
            self._failed(record, f"upstream: {type(exc).__name__}: {exc}")
            handler.send_error(502, "upstream unreachable")
        except (BrokenPipeError, ConnectionResetError) as exc:  # the worker went away
            self._failed(record, f"client gone: {type(exc).__name__}")

    def _answered(self, record: RequestRecord | None, status: int, data: bytes, offset: int,
                  events: bytes = b"") -> None:
        if record is None:
            return
        self._end(record, status=status)
        try:
            if data:
                answer = json.loads(data)
                if isinstance(answer, dict):
                    read_answer(record, answer)
            for line in events.decode(errors="replace").splitlines():
                if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                    chunk = json.loads(line[5:])
                    if isinstance(chunk, dict):
                        read_answer(record, chunk)
        except ValueError as exc:
            record.error = f"answer not JSON: {exc}"
        # The perf lines follow the answer in the log by a moment.
        text = self._log_since(offset)
        if self.log is not None and not _EVAL.search(text):
            time.sleep(0.2)
            text = self._log_since(offset)
        read_perf_log(record, text)

    def _failed(self, record: RequestRecord | None, why: str) -> None:
        if record is None:
            return
        self._end(record, error=why)

    def _end(self, record: RequestRecord, *, status: int | None = None, error: str = "") -> None:
        """The request's end: its wall and the server's CPU seconds, and how it ended."""
        with self._lock:
            record.seconds = time.monotonic() - record.began
            record.server_cpu_seconds = self._cpu_since(record)
            if status is not None:
                record.status = status
            if error:
                record.error = error
            record.finished = True


def median_rate(requests: list[dict[str, Any]], key: str) -> float | None:
    rates = [r[key] for r in requests if r.get(key) is not None]
    return statistics.median(rates) if rates else None


def requests_summary(requests: list[dict[str, Any]]) -> list[str]:
    """The cells of `--table`'s per-request row: per series (constrained,
    not), the count and median tokens/s (wall, and generation alone where the
    server said); the slowest request; the finish reasons; unanswered ones;
    the median CPU seconds per wall second the server got."""
    if not requests:
        return ["0", "not recorded", "not recorded", "-", "-", "-", "-"]

    def series(constrained: bool) -> str:
        mine = [r for r in requests if r["constrained"] is constrained]
        if not mine:
            return "none"
        wall = median_rate(mine, "tokens_per_second")
        gen = median_rate(mine, "generation_tokens_per_second")
        return (f"{len(mine)}: {_rate(wall)} tok/s wall"
                + (f", {_rate(gen)} generating" if gen is not None else ""))

    share = median_rate(requests, "server_cpu_share")

    slow = max(requests, key=lambda r: r["seconds"])
    slowest = (f"{slow['seconds']:.0f} s: {_n(slow['prompt_tokens'])} prompt, "
               f"{_n(slow['completion_tokens'])} completion tokens"
               + (" (constrained)" if slow["constrained"] else "")
               + ("" if slow["finished"] else ", unanswered"))
    reasons: dict[str, int] = {}
    for r in requests:
        key = r["finish_reason"] or ("unanswered" if not r["finished"] else "none")
        reasons[key] = reasons.get(key, 0) + 1
    return [str(len(requests)), series(True), series(False), slowest,
            ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])),
            str(sum(1 for r in requests if not r["finished"])),
            "-" if share is None else f"{share:.2f}"]


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"
