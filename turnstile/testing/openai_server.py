"""`FakeOpenAIServer`: an OpenAI-compatible Chat Completions server on a real
socket, scripted by a test, as strict as the real endpoints.

    from turnstile.testing import FakeOpenAIServer, TestStack, text_reply, tool_reply

    with FakeOpenAIServer() as server:
        server.script(tool_reply(("c1", "lendBook", {"book": "B-1"})),
                      text_reply("Lent B-1"))
        async with TestStack(app, tmp_path, env={"LLM_BASE_URL": server.url}) as stack:
            result = await stack.run("Please lend B-1", approve="bob")
        assert server.requests[0]["tools"]  # what your app sent, as received

How to test an app's HTTP model settings (`Service(model=ModelSettings(...))`,
LLM_* settings) offline: the app's real model client talks HTTP to this
server. Tests queue replies (completion bodies, or `RawReply` status/headers/
body, or a function of the request) and read back every request the server
received, in order (`requests`; each carries `_path`, `_auth` and `_bytes`,
the size of the body as received). `default` answers when the queue is empty
(None: a 500).

A request with `"stream": true` gets the scripted completion as server-sent
events (content in pieces, `stream_delay` seconds apart). `POST .../moderations`
is answered by `moderation` (default: not flagged) and recorded in
`moderation_requests`, apart from the chat requests.

As strict as a real endpoint: a chat request that is not a valid OpenAI Chat
Completions request (turnstile.testing.openai_conformance: the official
request types of the `openai` package, and every tool call answered exactly
once) is refused with a 400, as OpenAI refuses it, and recorded in `refusals`;
a body that is not strict JSON, or not declared as JSON, too; a request above
`max_request_bytes` is refused with a 400 `context_length_exceeded`. An
assistant message with `tool_calls` and `"content": null` is refused with a
500 and a validation-error body, as llama-cpp-python's server refuses it (the
double is as strict as the strictest real server). `cut_streams` cuts that
many upcoming streams midway (no final chunk, no `[DONE]`), as a dropped
connection does.

The request types come from the `openai` package: install the `testing`
extra (`pip install 'turnstile[testing]'`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass
class RawReply:
    """A reply as raw HTTP: status, body text and headers (an error page, a
    429 with `retry-after`, a body that is not JSON)."""

    status: int
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)


# What a test queues: a completion body, a raw reply, or a function of the
# request (its JSON body) returning either.
ScriptedReply = (dict[str, Any] | RawReply
                 | Callable[[dict[str, Any]], "dict[str, Any] | RawReply"])


def text_reply(text: str) -> dict[str, Any]:
    """A completion whose answer is `text`."""
    return {"id": "cmpl", "model": "fake", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}}


def tool_reply(*calls: tuple[str, str, dict[str, Any] | str]) -> dict[str, Any]:
    """A completion that calls tools; calls: (id, name, arguments as an object
    or as raw text, e.g. JSON that does not parse)."""
    return {"id": "cmpl", "model": "fake", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function", "function": {
                    "name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                for cid, name, args in calls]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}}


def moderation_reply(flagged: bool, *categories: str) -> dict[str, Any]:
    """A moderations answer (`FakeOpenAIServer.moderation`)."""
    return {"id": "modr", "model": "fake-moderation", "results": [
        {"flagged": flagged, "categories": dict.fromkeys(categories, True)}]}


def sse_chunks(reply: dict[str, Any], piece: int = 6) -> list[dict[str, Any]]:
    """A completion body as the chunks a streaming server sends."""
    choice = reply["choices"][0]
    msg = choice["message"]
    base = {"id": reply.get("id", "cmpl"), "model": reply.get("model", "fake"),
            "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant"})]
    text = msg.get("content") or ""
    out += [chunk({"content": text[i:i + piece]}) for i in range(0, len(text), piece)]
    for i, call in enumerate(msg.get("tool_calls") or []):
        args = call["function"]["arguments"]
        half = len(args) // 2
        out.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"],
                                                       "arguments": args[:half]}}]}))
        out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]}))
    out.append(chunk({}, choice.get("finish_reason") or "stop"))
    if reply.get("usage"):
        out.append({**base, "choices": [], "usage": reply["usage"]})
    return out


def null_content_beside_calls(body: dict[str, Any]) -> int | None:
    """The index of the first assistant message with tool calls and null content."""
    for i, m in enumerate(body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls") \
                and "content" in m and m["content"] is None:
            return i
    return None


def llama_cpp_python_validation_error(index: int) -> str:
    """The 500 llama-cpp-python 0.3's server answers a request its request
    model cannot read (its route handler wraps the validation error)."""
    detail = [{"type": "string_type", "loc": ["body", "messages", index, "typed-dict", "content"],
               "msg": "Input should be a valid string", "input": None}]
    return json.dumps({"error": {"message": f"1 validation error: {detail}",
                                 "type": "internal_server_error", "param": None, "code": None}})


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def unreadable_body(content_type: str | None, raw: bytes) -> str | None:
    """Why a real endpoint could not read this request body, or None: a body
    not declared as JSON, or not strict JSON (NaN and Infinity are not)."""
    if (content_type or "").split(";")[0].strip().lower() != "application/json":
        return f"Content-Type must be application/json, not {content_type!r}"
    try:
        json.loads(raw, parse_constant=_no_constants)
    except ValueError as exc:
        return f"We could not parse the JSON body of your request: {exc}"
    return None


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client gone mid-answer (a model call cancelled or timed out, its
        # connection closed) is no error of the server's; real servers (uvicorn,
        # llama-server) note it quietly too. Anything else is printed as before.
        if isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            return
        super().handle_error(request, client_address)


class FakeOpenAIServer:
    """A scripted OpenAI-compatible server (see the module docstring); `url`
    is its base URL (LLM_BASE_URL). Serves from a thread of its own until
    `close()` (or the end of a `with` block)."""

    def __init__(self, keep_alive: bool = False, port: int = 0) -> None:
        """`keep_alive`: HTTP/1.1 with persistent connections, as real
        endpoints (vLLM, Ollama, OpenAI) serve; the default, HTTP/1.0, closes
        every connection after its response. `port`: 0 for any free one (a
        test that brings a server back where a turn expects it names it)."""
        try:  # the official request types, from the `testing` extra
            from turnstile.testing.openai_conformance import violations
        except ImportError as missing:
            raise ImportError(
                "FakeOpenAIServer checks requests against the `openai` package's request "
                "types: pip install 'turnstile[testing]'") from missing
        self._violations = violations
        self.replies: list[ScriptedReply] = []
        self.requests: list[dict[str, Any]] = []
        self.default: ScriptedReply | None = None
        self.stream_delay = 0.0
        self.moderation: ScriptedReply = moderation_reply(False)
        self.moderation_requests: list[dict[str, Any]] = []
        self.max_request_bytes: int | None = None
        self.cut_streams = 0
        self.cut_mid_line = False  # cut streams end inside a line, not between events
        self.refusals: list[str] = []  # why requests were refused with a 400
        # Refuse null content beside tool_calls with a 500, as llama-cpp-python
        # does (only a test of an older release's worker turns it off).
        self.null_content_refused = True
        self.connections = 0  # accepted so far
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
            # TCP_NODELAY, as real servers (uvicorn, llama-server) set it: the
            # headers and the body are two writes, and with Nagle on the body
            # waited for the client's delayed ACK, ~40 ms on every response.
            disable_nagle_algorithm = True

            def setup(self) -> None:  # once per connection
                with fake._lock:
                    fake.connections += 1
                super().setup()

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) or b"{}"
                unreadable = unreadable_body(self.headers.get("content-type"), raw)
                if unreadable is not None:  # as OpenAI's and llama-server's JSON parsers
                    with fake._lock:
                        fake.refusals.append(unreadable)
                    data = json.dumps({"error": {"message": unreadable,
                                                 "type": "invalid_request_error"}}).encode()
                    self.send_response(400)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                body = json.loads(raw)
                if self.path.endswith("/moderations"):
                    body["_path"] = self.path
                    body["_auth"] = self.headers.get("authorization")
                    reply = fake._moderate(body)
                else:
                    refusal = fake._refusal(body, length)
                    body["_path"] = self.path
                    body["_auth"] = self.headers.get("authorization")
                    body["_bytes"] = length
                    reply = fake._next(body) if refusal is None else refusal
                    if body.get("stream") and not isinstance(reply, RawReply):
                        self._stream(reply)
                        return
                if isinstance(reply, RawReply):
                    status, text, headers = reply.status, reply.body, reply.headers
                else:
                    status, text, headers = 200, json.dumps(reply), {}
                data = text.encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, reply: dict[str, Any]) -> None:
                # Without content-length: the body ends when the connection closes.
                self.close_connection = True
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                chunks = sse_chunks(reply)
                with fake._lock:
                    cut = fake.cut_streams > 0
                    fake.cut_streams -= int(cut)
                    mid_line = cut and fake.cut_mid_line
                if cut:  # the connection drops midway: no final chunk, no [DONE]
                    for chunk in chunks[: max(1, len(chunks) // 2)]:
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    if mid_line:  # ... in the middle of the next event's line
                        rest = chunks[max(1, len(chunks) // 2)]
                        line = f"data: {json.dumps(rest)}"
                        self.wfile.write(line[: len(line) // 2].encode())
                    self.wfile.flush()
                    return
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    if fake.stream_delay:
                        time.sleep(fake.stream_delay)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        self.server = _Server(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _next(self, request: dict[str, Any]) -> dict[str, Any] | RawReply:
        with self._lock:
            self.requests.append(request)
            reply = self.replies.pop(0) if self.replies else self.default
        if reply is None:
            return RawReply(500, '{"error": "FakeOpenAIServer has no scripted reply left"}')
        return reply(request) if callable(reply) else reply

    def _refusal(self, body: dict[str, Any], length: int) -> RawReply | None:
        """A 400 where a real endpoint refuses (the request is recorded all the same).
        llama.cpp's server takes a request without `model`; OpenAI and Ollama do
        not, so a missing model is checked as if one were configured."""
        null = null_content_beside_calls(body) if self.null_content_refused else None
        if null is not None:
            with self._lock:
                self.refusals.append(f"messages[{null}].content is null beside tool_calls")
                self.requests.append({**body, "_refused": self.refusals[-1], "_bytes": length})
            return RawReply(500, llama_cpp_python_validation_error(null))
        if self.max_request_bytes is not None and length > self.max_request_bytes:
            why = f"context_length_exceeded: {length:,} bytes > {self.max_request_bytes:,}"
        else:
            problems = self._violations({"model": "(server default)", **body})
            if not problems:
                return None
            why = "; ".join(problems)
        with self._lock:
            self.refusals.append(why)
            self.requests.append({**body, "_refused": why, "_bytes": length})
        return RawReply(400, json.dumps({"error": {"message": why,
                                              "type": "invalid_request_error"}}))

    def _moderate(self, request: dict[str, Any]) -> dict[str, Any] | RawReply:
        with self._lock:
            self.moderation_requests.append(request)
            reply = self.moderation
        return reply(request) if callable(reply) else reply

    def script(self, *replies: ScriptedReply) -> None:
        """Queue replies, answered in order, one per chat request."""
        with self._lock:
            self.replies.extend(replies)

    def reset(self) -> None:
        """Back to a fresh server's state (one server can serve many tests)."""
        with self._lock:
            self.replies.clear()
            self.requests.clear()
            self.default = None
            self.stream_delay = 0.0
            self.moderation = moderation_reply(False)
            self.moderation_requests.clear()
            self.max_request_bytes = None
            self.cut_streams = 0
            self.cut_mid_line = False
            self.refusals.clear()
            self.null_content_refused = True

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeOpenAIServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
