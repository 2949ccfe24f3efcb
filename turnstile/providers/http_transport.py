"""The model client's HTTP/1.1 transport: asyncio streams and h11 under httpx.

httpx stays the client (headers, timeouts, proxies from the environment,
errors); this replaces what it runs a request on by default (httpcore's
connection pool over anyio). httpcore's pool checks every pooled
connection (a poll of its socket each) whenever a request starts or ends,
so its cost grows with the requests in flight; the figures (`python -m
bench.micro model-request model-request-httpcore model-request-c20
model-request-c20-httpcore`) are in bench/README.md. A turn makes a
request per model call.

What it does, and no more:

- HTTP/1.1 over TCP, or TLS (`https`, verified with httpx's default
  context); no HTTP/2, no proxy (httpx sends proxied requests, from the
  environment, through its own transport);
- keep-alive: a connection whose exchange ended cleanly goes back to an
  idle pool per origin (at most `max_idle` each); one the server closed,
  one with unread bytes, one of a response not read to its end (a body
  over the client's bound, a cancelled read) is closed, never reused;
- a request sent on a reused connection that the server had closed (the
  race of an idle timeout) is sent once more on a new connection, when
  not a byte of a response came back;
- every wait is bounded by httpx's timeouts (connect, write, read per
  read): nothing waits forever on a silent server;
- failures are httpx's own exceptions (`httpx.TransportError`'s family),
  so callers handle them as with any transport.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any

import h11
import httpx

Origin = tuple[str, str, int]
_READ_SIZE = 64 * 1024


def _timeouts(request: httpx.Request) -> dict[str, float | None]:
    found: dict[str, float | None] = request.extensions.get("timeout") or {}
    return found


class _Connection:
    """One socket and its h11 state machine."""

    def __init__(self, origin: Origin, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.origin = origin
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.reused = False
        self.received = False  # a byte of the current response came back

    def usable(self) -> bool:
        """An idle connection may carry a request: open, nothing unread (by
        h11 or in the stream: bytes after a response are no answer to the
        next request)."""
        trailing, closed = self.h11.trailing_data
        return (not trailing and not closed and not self.writer.is_closing()
                and not self.reader.at_eof()
                and not self.reader._buffer)  # type: ignore[attr-defined]  # bytes unasked for

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()

    async def send(self, request: httpx.Request, body: bytes, timeout: float | None) -> None:
        target = request.url.raw_path
        headers = [(k, v) for k, v in request.headers.raw]
        data = self.h11.send(h11.Request(method=request.method.encode(), target=target,
                                         headers=headers))
        if body:
            data += self.h11.send(h11.Data(data=body))
        data += self.h11.send(h11.EndOfMessage())
        self.writer.write(data)
        try:
            async with asyncio.timeout(timeout):
                await self.writer.drain()
        except TimeoutError as exc:
            raise httpx.WriteTimeout("timed out sending the request", request=request) from exc
        except OSError as exc:
            raise httpx.WriteError(f"sending the request: {exc!r}", request=request) from exc

    async def next_event(self, request: httpx.Request, timeout: float | None) -> Any:
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc), request=request) from exc
            if event is not h11.NEED_DATA:
                return event
            try:
                async with asyncio.timeout(timeout):
                    data = await self.reader.read(_READ_SIZE)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("timed out waiting for the response",
                                        request=request) from exc
            except OSError as exc:
                raise httpx.ReadError(f"reading the response: {exc!r}",
                                      request=request) from exc
            if data:
                self.received = True
            try:
                self.h11.receive_data(data)  # b"": the server closed its side
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc), request=request) from exc


class _ResponseBody(httpx.AsyncByteStream):
    """The body, read as the caller reads it; its connection goes back to
    the pool only once the exchange ended cleanly."""

    def __init__(self, transport: ModelServerTransport, conn: _Connection,
                 request: httpx.Request, read_timeout: float | None) -> None:
        self.transport, self.conn = transport, conn
        self.request, self.read_timeout = request, read_timeout
        self.ended = self.released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while not self.ended:
            event = await self.conn.next_event(self.request, self.read_timeout)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.ended = True
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError(
                    "the server closed the connection before the response ended",
                    request=self.request)

    async def aclose(self) -> None:
        if not self.released:
            self.released = True
            self.transport.release(self.conn, clean=self.ended)


class ModelServerTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 on asyncio streams with h11, connections kept alive per origin."""

    def __init__(self, *, max_idle: int = 32, ssl_context: ssl.SSLContext | None = None) -> None:
        self.max_idle = max_idle
        self._ssl = ssl_context
        self._idle: dict[Origin, list[_Connection]] = {}
        self._closed = False

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        return self._ssl

    async def _connect(self, request: httpx.Request, origin: Origin,
                       timeout: float | None) -> _Connection:
        scheme, host, port = origin
        tls = self._tls() if scheme == "https" else None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=tls, server_hostname=host if tls else None,
                    limit=_READ_SIZE * 4)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out",
                                       request=request) from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(f"connecting to {host}:{port}: {exc!r}",
                                     request=request) from exc
        return _Connection(origin, reader, writer)

    def _pooled(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.usable():
                conn.reused = True
                return conn
            conn.close()
        return None

    def release(self, conn: _Connection, *, clean: bool) -> None:
        """A response ended (`clean`: read to its end): keep or close its connection."""
        if clean and not self._closed and conn.h11.our_state is h11.DONE \
                and conn.h11.their_state is h11.DONE:
            conn.h11.start_next_cycle()
            conn.received = False
            idle = self._idle.setdefault(conn.origin, [])
            if len(idle) < self.max_idle and conn.usable():
                idle.append(conn)
                return
        conn.close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        scheme = request.url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}",
                                            request=request)
        port = request.url.port or (443 if scheme == "https" else 80)
        origin: Origin = (scheme, request.url.host, port)
        timeouts = _timeouts(request)
        body = b"".join([chunk async for chunk in request.stream])  # type: ignore[union-attr]
        conn = self._pooled(origin)
        while True:
            if conn is None:
                conn = await self._connect(request, origin, timeouts.get("connect"))
            answered = False
            try:
                response = await self._exchange(conn, request, body, timeouts)
                answered = True
                return response
            except httpx.TransportError:
                # A reused connection the server had closed before this request
                # reached it: nothing was answered, so send it on a new one.
                if conn.reused and not conn.received:
                    conn.close()
                    conn = None
                    continue
                raise
            finally:
                if not answered and conn is not None:  # failed or cancelled midway
                    conn.close()

    async def _exchange(self, conn: _Connection, request: httpx.Request, body: bytes,
                        timeouts: dict[str, float | None]) -> httpx.Response:
        await conn.send(request, body, timeouts.get("write"))
        while True:
            event = await conn.next_event(request, timeouts.get("read"))
            if isinstance(event, h11.Response):
                break
            if isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError(
                    "the server closed the connection without a response", request=request)
            # h11.InformationalResponse (1xx): the final response follows
        stream = _ResponseBody(self, conn, request, timeouts.get("read"))
        return httpx.Response(
            event.status_code, headers=event.headers, stream=stream,
            extensions={"http_version": b"HTTP/" + event.http_version,
                        "reason_phrase": event.reason})

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
