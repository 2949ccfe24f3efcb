"""The model client's transport (turnstile/providers/http_transport.py) on
real sockets: a local HTTP/1.1 server in the test's loop that answers as
told (kept alive, closed, chunked, split at any byte, silent, cut short,
over TLS) and counts the connections it accepted and the requests it read."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from turnstile.engine.messages import ChatMessage
from turnstile.providers.base import ModelRequest
from turnstile.providers.http_transport import ModelServerTransport
from turnstile.providers.openai_compat import OpenAICompatibleProvider, RetryableModelError

COMPLETION = json.dumps({
    "id": "c1", "object": "chat.completion", "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()


def plain(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json",
            f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(body: bytes, size: int = 7) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    for i in range(0, len(body), size):
        part = body[i:i + size]
        out += b"%x\r\n%s\r\n" % (len(part), part)
    return out + b"0\r\n\r\n"


@dataclass
class Server:
    """Answers each request with `answer(n)` (n: the request's number from 1):
    a list of byte strings written one by one, a pause (float seconds)
    between them when given, then `close` (bool) closes the connection."""
    answer: Callable[[int], tuple[list[bytes | float], bool]]
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                self.requests.append(head + await reader.readexactly(length))
                parts, close = self.answer(len(self.requests))
                for part in parts:
                    if isinstance(part, float):
                        await asyncio.sleep(part)
                    else:
                        writer.write(part)
                        await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., object]]:
    started: list[asyncio.Server] = []

    async def start(answer: Callable[[int], tuple[list[bytes | float], bool]],
                    tls: ssl.SSLContext | None = None) -> Server:
        s = Server(answer)
        s.server = await asyncio.start_server(s.handle, "127.0.0.1", 0, ssl=tls)
        started.append(s.server)
        return s
    yield start
    for server in started:
        server.close()


def client(transport: ModelServerTransport | None = None, read: float = 5.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=transport or ModelServerTransport(),
                             timeout=httpx.Timeout(read, connect=2.0))


async def post(c: httpx.AsyncClient, url: str) -> bytes:
    async with c.stream("POST", url, content=b'{"messages": []}',
                        headers={"Content-Type": "application/json"}) as resp:
        assert resp.status_code == 200
        return b"".join([part async for part in resp.aiter_bytes()])


async def test_a_kept_alive_connection_carries_every_request(serve) -> None:
    server = await serve(lambda n: ([plain(COMPLETION)], False))
    async with client() as c:
        for _ in range(5):
            assert await post(c, server.url) == COMPLETION
    assert (server.connections, len(server.requests)) == (1, 5)
    assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\ncontent-length: 16\r\n" in server.requests[0].lower()


async def test_a_connection_the_server_closed_while_idle_is_not_an_error(serve) -> None:
    # The server drops every connection after its answer without saying so
    # (an idle timeout racing the next request): each request still gets its
    # answer, on a connection of its own.
    server = await serve(lambda n: ([plain(COMPLETION)], True))
    async with client() as c:
        for _ in range(3):
            assert await post(c, server.url) == COMPLETION
            await asyncio.sleep(0.05)  # the close reaches the client first
    assert (server.connections, len(server.requests)) == (3, 3)


async def test_a_request_on_a_connection_closed_as_it_was_sent_is_sent_again(serve) -> None:
    # Here the client cannot know: the server reads the second request on the
    # kept connection and closes it without a byte of answer. Sent once more,
    # on a new connection; the server read it twice.
    def answer(n: int) -> tuple[list[bytes | float], bool]:
        return ([], True) if n == 2 else ([plain(COMPLETION)], False)
    server = await serve(answer)
    async with client() as c:
        assert await post(c, server.url) == COMPLETION
        assert await post(c, server.url) == COMPLETION
    assert (server.connections, len(server.requests)) == (2, 3)


async def test_a_fresh_connection_cut_short_is_an_error_not_a_resend(serve) -> None:
    server = await serve(lambda n: ([plain(COMPLETION)[:40]], True))
    async with client() as c:
        with pytest.raises(httpx.TransportError):
            await post(c, server.url)
    assert len(server.requests) == 1


async def test_connection_close_and_unread_bodies_are_not_reused(serve) -> None:
    server = await serve(lambda n: ([plain(COMPLETION, "Connection: close")], n == 1)
                         if n == 1 else ([plain(COMPLETION * 50)], False))
    transport = ModelServerTransport()
    async with client(transport) as c:
        assert await post(c, server.url) == COMPLETION  # "Connection: close"
        async with c.stream("POST", server.url, content=b"{}") as resp:
            async for _ in resp.aiter_bytes():
                break  # read in part: the connection must go
        assert await post(c, server.url) == COMPLETION * 50
        assert await post(c, server.url) == COMPLETION * 50
    assert (server.connections, len(server.requests)) == (3, 4)


@pytest.mark.parametrize("later", [False, True])
async def test_bytes_after_an_answer_are_not_read_as_the_next_one(serve, later: bool) -> None:
    junk = plain(b'{"stale": true}')
    server = await serve(lambda n: ([plain(COMPLETION), *([0.05] if later else []), junk], False)
                         if n == 1 else ([plain(COMPLETION)], False))
    async with client() as c:
        assert await post(c, server.url) == COMPLETION
        await asyncio.sleep(0.1)
        assert await post(c, server.url) == COMPLETION
    assert (server.connections, len(server.requests)) == (2, 2)


async def test_a_silent_server_times_out_within_the_read_timeout(serve) -> None:
    server = await serve(lambda n: ([30.0], True))
    async with client(read=0.3) as c:
        began = asyncio.get_running_loop().time()
        with pytest.raises(httpx.ReadTimeout):
            await post(c, server.url)
        assert asyncio.get_running_loop().time() - began < 5


async def test_a_refused_connection_is_a_connect_error(serve) -> None:
    server = await serve(lambda n: ([plain(COMPLETION)], False))
    url = server.url
    server.server.close()  # type: ignore[union-attr]
    await server.server.wait_closed()  # type: ignore[union-attr]
    async with client() as c:
        with pytest.raises(httpx.ConnectError):
            await post(c, url)


@hsettings(max_examples=40, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(1, 400), max_size=8), size=st.integers(0, 300),
       as_chunks=st.booleans(), pause=st.booleans())
async def test_any_split_of_the_answer_reads_whole_and_keeps_the_connection(
        serve, cuts: list[int], size: int, as_chunks: bool, pause: bool) -> None:
    body = bytes(range(256)) * 2
    body = body[:size]
    raw = chunked(body, size=max(1, size // 3)) if as_chunks else plain(body)
    marks = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    parts: list[bytes | float] = []
    for a, b in zip(marks, marks[1:], strict=False):
        parts.append(raw[a:b])
        if pause:
            parts.append(0.001)
    server = await serve(lambda n: (parts, False))
    async with client() as c:
        assert await post(c, server.url) == body
        assert await post(c, server.url) == body
    assert server.connections == 1


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True)
    return key, cert


async def test_https_verifies_the_server(serve, tmp_path: Path) -> None:
    key, cert = _self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server = await serve(lambda n: ([plain(COMPLETION)], False), tls=tls)
    url = server.url.replace("http://", "https://")
    trusting = ssl.create_default_context(cafile=str(cert))
    async with client(ModelServerTransport(ssl_context=trusting)) as c:
        assert await post(c, url) == COMPLETION
        assert await post(c, url) == COMPLETION
    assert server.connections == 1
    async with client() as c:  # the default trust store does not know it
        with pytest.raises(httpx.ConnectError):
            await post(c, url)


async def test_the_model_provider_reports_a_dropped_answer_as_retryable(serve) -> None:
    server = await serve(lambda n: ([plain(COMPLETION)[:60]], True))
    provider = OpenAICompatibleProvider(server.url.removesuffix("/chat/completions"),
                                        timeout_seconds=5)
    try:
        with pytest.raises(RetryableModelError):
            await provider.complete(ModelRequest(
                messages=[ChatMessage(role="user", content="hi")]))
    finally:
        await provider.aclose()


@pytest.mark.parametrize("where", ["before the answer", "inside the body"])
async def test_a_cancelled_request_leaves_no_connection_behind(serve, where: str) -> None:
    # A model call cancelled with its turn: the connection, in an unknown
    # state, is closed; the next request gets a new one and its own answer.
    head = plain(COMPLETION)[:-len(COMPLETION)]

    def answer(n: int) -> tuple[list[bytes | float], bool]:
        if n == 1:
            return ([30.0] if where == "before the answer" else [head, b"{", 30.0]), False
        return [plain(COMPLETION)], False
    server = await serve(answer)
    async with client() as c:
        task = asyncio.create_task(post(c, server.url))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await post(c, server.url) == COMPLETION
    assert (server.connections, len(server.requests)) == (2, 2)
