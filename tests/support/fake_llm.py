"""A scripted OpenAI-compatible Chat Completions server on a real socket.

Tests queue replies (completion bodies, or raw HTTP status/headers/body) and
read back every request the server received, in order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Raw:
    status: int
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)


Reply = dict[str, Any] | Raw | Callable[[dict[str, Any]], "dict[str, Any] | Raw"]


def text_reply(text: str) -> dict[str, Any]:
    return {"id": "cmpl", "model": "fake", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}}


def tool_reply(*calls: tuple[str, str, dict[str, Any] | str]) -> dict[str, Any]:
    """calls: (id, name, arguments-object-or-raw-text)."""
    return {"id": "cmpl", "model": "fake", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function", "function": {
                    "name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                for cid, name, args in calls]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}}


class FakeLLM:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.default: Reply | None = None
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                body["_path"] = self.path
                body["_auth"] = self.headers.get("authorization")
                reply = fake._next(body)
                if isinstance(reply, Raw):
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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _next(self, request: dict[str, Any]) -> dict[str, Any] | Raw:
        with self._lock:
            self.requests.append(request)
            reply = self.replies.pop(0) if self.replies else self.default
        if reply is None:
            return Raw(500, '{"error": "fake LLM has no scripted reply left"}')
        return reply(request) if callable(reply) else reply

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self.replies.clear()
            self.requests.clear()
            self.default = None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="session")
def _fake_llm_server() -> Iterator[FakeLLM]:
    server = FakeLLM()
    yield server
    server.close()


@pytest.fixture
def fake_llm(_fake_llm_server: FakeLLM) -> Iterator[FakeLLM]:
    _fake_llm_server.reset()
    yield _fake_llm_server
    _fake_llm_server.reset()
