"""The inbox behind a proxy, over real HTTP: the inbox served as the product
serves it (turnstile.inbox.web_app.server, uvicorn with its proxy-header handling
off), a real dev server, worker and the strict fake model.

- The trusted proxy is an address as the socket sees it: the "proxy" here
  connects from 127.0.0.2 (a second loopback address), everyone else from
  127.0.0.1. `X-Forwarded-For: 10.0.0.5` (the issue's spoof), a forwarded-for
  chain ending in a trusted address, `Forwarded: for=` and `X-Real-IP` from
  127.0.0.1 are refused, decide nothing, and are logged.
- The identity header is read from its bytes as UTF-8: `Ölaf` sent as UTF-8
  is Ölaf (who may not approve ölaf's own call), as RFC 8187 too; Latin-1
  bytes and the mojibake `Ã\\x96laf` are refused and logged; `Zoë` decides
  and the decision row says `Zoë`. Generated names and bytes (Hypothesis,
  bounded): the page names exactly the reviewer `decoded_identity` accepts,
  and refuses the rest.
- Any workflow id reaches its own page (generated ids with `/`, `..`, `%2F`,
  `?`, `#`, `&`, dot segments).
- Header-mode sessions: a Secure, HttpOnly, SameSite=Strict, expiring cookie;
  a token from another session or none is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from markupsafe import escape
from temporalio.client import Client

from tests.support.processes import free_port
from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker, wait_pending
from tests.test_client import plain_service
from tests.test_inbox import _settings
from turnstile.engine.turn_input_rules import id_problem
from turnstile.inbox.security import SESSION_COOKIE, decoded_identity
from turnstile.inbox.views import call_url
from turnstile.inbox.web_app import build_app, server
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

PROXY, OUTSIDE = "127.0.0.2", "127.0.0.1"
EXAMPLES = 40
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """The inbox on a free port, started as `starter.py inbox` starts it."""
    port = free_port()
    inbox = server(app, "127.0.0.1", port, log_level="warning")
    thread = threading.Thread(target=inbox.run, daemon=True)
    thread.start()
    for _ in range(200):
        if inbox.started:
            break
        time.sleep(0.02)
    assert inbox.started, "the inbox did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        inbox.should_exit = True
        thread.join(10)


class Peer:
    """HTTP from one source address, with its own session cookie (kept by
    hand: header-mode cookies are `Secure`, and this is local http)."""

    def __init__(self, base: str, address: str) -> None:
        self.http = httpx.Client(base_url=base, follow_redirects=False, timeout=20,
                                 transport=httpx.HTTPTransport(local_address=address))
        self.session = ""
        self.set_cookie = ""

    def request(self, method: str, url: str, headers: list[tuple[str, bytes]] | None = None,
                **kw: Any) -> httpx.Response:
        sent = list(headers or [])
        if self.session:
            sent.append(("Cookie", f"{SESSION_COOKIE}={self.session}".encode()))
        response = self.http.request(method, url, headers=sent, **kw)
        for line in response.headers.get_list("set-cookie"):
            if line.startswith(SESSION_COOKIE + "="):
                self.set_cookie = line
                self.session = line.split(";")[0].split("=", 1)[1]
        return response


def _token(page: str) -> str:
    import re

    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found is not None, page[:2000]
    return found.group(1)


def _header_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNSTILE_INBOX_IDENTITY_HEADER", "X-Forwarded-User")
    monkeypatch.setenv("TURNSTILE_INBOX_SECRET", "stable-secret")
    monkeypatch.setenv("TURNSTILE_INBOX_TRUSTED_PROXIES", f"10.0.0.5, {PROXY}")
    monkeypatch.delenv("TURNSTILE_INBOX_PROXY_SECRET", raising=False)
    monkeypatch.delenv("TURNSTILE_INBOX_SECURE_COOKIE", raising=False)
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)


def _user(name: str | bytes) -> tuple[str, bytes]:
    return ("X-Forwarded-User", name if isinstance(name, bytes) else name.encode("utf-8"))


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "turnstile.inbox.security" and "refused" in r.getMessage()]


async def test_spoofed_peers_and_encoded_names_decide_nothing(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    _header_env(monkeypatch)
    caplog.set_level(logging.WARNING, logger="turnstile.inbox.security")
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com",
                                                          "amount": 3})),
                    text_reply("paid"))
    url = f"sqlite:///{tmp_path}/t.db"
    async with running_worker(client, task_queue, url, [plain_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob", user="ölaf", service="test",
                                   conversation=f"c-{uuid.uuid4().hex[:6]}")
        await wait_pending(handle)
        call = call_url(handle.id, "p1")
        with serving(build_app(_settings(temporal_server, task_queue, url))) as base:
            proxy, outside = Peer(base, PROXY), Peer(base, OUTSIDE)

            def run() -> dict[str, Any]:
                seen: dict[str, Any] = {}
                page = proxy.request("GET", call, [_user("carol")])
                assert page.status_code == 200, page.text[:2000]
                token = _token(page.text)
                seen["cookie"] = proxy.set_cookie
                # The spoof: from 127.0.0.1, a forwarded-for naming a trusted proxy.
                outside.session = proxy.session
                for forwarded in ([("X-Forwarded-For", b"10.0.0.5")],
                                  [("X-Forwarded-For", PROXY.encode())],
                                  [("X-Forwarded-For", b"1.2.3.4, 10.0.0.5")],
                                  [("X-Forwarded-For", b"10.0.0.5"),
                                   ("X-Forwarded-For", b"10.0.0.5")],
                                  [("Forwarded", b"for=10.0.0.5")],
                                  [("X-Real-IP", b"10.0.0.5")]):
                    answer = outside.request("POST", call, [*forwarded, _user("mallory")],
                                             data={"decision": "approve", "csrf": token})
                    seen.setdefault("spoofed", []).append(
                        (answer.status_code, "only from the configured proxy" in answer.text,
                         "mallory" in answer.text))
                # Latin-1 bytes, and the mojibake Latin-1 made of UTF-8 "Ö".
                for raw in ("Ölaf".encode("latin-1"), "Ã\x96laf".encode()):
                    answer = proxy.request("POST", call, [_user(raw)],
                                           data={"decision": "approve", "csrf": token})
                    seen.setdefault("undecodable", []).append((answer.status_code, answer.text))
                # UTF-8 "Ölaf" (and RFC 8187) is Ölaf: ölaf's own call is refused.
                for raw in ("Ölaf".encode(), b"UTF-8''%C3%96laf"):
                    page = proxy.request("GET", call, [_user(raw)])
                    assert page.status_code == 200, page.text[:2000]
                    answer = proxy.request("POST", call, [_user(raw)],
                                           data={"decision": "approve",
                                                 "csrf": _token(page.text)})
                    seen.setdefault("olaf", []).append((answer.status_code, answer.text))
                # A token from another session (or none) is refused.
                stranger = Peer(base, PROXY)
                seen["stranger"] = stranger.request(
                    "POST", call, [_user("carol")],
                    data={"decision": "approve", "csrf": token}).status_code
                page = proxy.request("GET", call, [_user("Zoë")])
                done = proxy.request("POST", call, [_user("Zoë")],
                                     data={"decision": "approve", "csrf": _token(page.text)})
                seen["done"] = (done.status_code, done.text)
                return seen

            seen = await asyncio.to_thread(run)
            result = await handle.result()
        with turns.rt.db.connect() as conn:
            rows = fetchall(conn, "SELECT reviewer FROM approval_decision WHERE workflow_id = :w",
                            {"w": handle.id})
    cookie = seen["cookie"].lower()
    assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie
    assert "max-age=43200" in cookie
    assert seen["spoofed"] == [(400, True, False)] * 6, seen["spoofed"]
    (latin, latin_page), (moji, moji_page) = seen["undecodable"]
    assert latin == 400 and "not UTF-8 (byte 0xd6 at position 0)" in latin_page
    assert moji == 400 and "names no reviewer" in moji_page
    for status, page in seen["olaf"]:
        assert status == 409 and "requested this call" in page, page[:2000]
        assert "reviewing as <b id=\"reviewer\">Ölaf</b>" in page
    assert seen["stranger"] == 403
    assert seen["done"][0] == 200 and "sendMoneySlowly approved by Zoë" in seen["done"][1]
    assert [r["reviewer"] for r in rows] == ["Zoë"]
    assert result.tool_calls[0].status.value == "completed"
    logged = _refusals(caplog)
    assert sum("only from the configured proxy" in m and "'127.0.0.1'" in m
               for m in logged) == 6, logged
    assert any("not UTF-8" in m for m in logged) and any("names no reviewer" in m
                                                         for m in logged)


header_bytes = st.binary(min_size=1, max_size=24).map(
    lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7f and c not in b"\r\n")).filter(
    lambda b: bool(b.strip(b" \t")))
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)),
                min_size=1, max_size=16).filter(
    lambda s: "\r" not in s and "\n" not in s and "\x00" not in s
    and bool(s.encode().strip(b" \t")) and all(c >= 0x20 or c == 9 for c in s.encode()))


@pytest.fixture
def header_inbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 temporal_server: DevServer) -> Iterator[str]:
    _header_env(monkeypatch)
    app = build_app(_settings(temporal_server, "no-worker", f"sqlite:///{tmp_path}/h.db"))
    with serving(app) as base:
        yield base


@SETTINGS
@given(st.one_of(names.map(lambda s: s.encode()), header_bytes))
def test_generated_header_values_name_exactly_whom_they_decode_to(
        header_inbox: str, raw: bytes) -> None:
    proxy = Peer(header_inbox, PROXY)
    page = proxy.request("GET", "/decided", [_user(raw)])
    name, problem = decoded_identity(raw)
    if name is None:
        assert page.status_code == 400, (raw, page.text[:500])
        assert str(escape(problem or "")) in page.text
    else:
        assert page.status_code == 200, (raw, page.text[:500])
        assert f'reviewing as <b id="reviewer">{escape(name)}</b>' in page.text
        assert raw.decode("utf-8").strip(" \t") == name or raw.lower().startswith(b"utf-8''")
    # From anywhere but the proxy, the same header names nobody.
    spoofed = Peer(header_inbox, OUTSIDE).request(
        "GET", "/decided", [("X-Forwarded-For", PROXY.encode()), _user(raw)])
    assert spoofed.status_code == 400 and "only from the configured proxy" in spoofed.text


ids = st.lists(st.sampled_from(list("ab-_/.%?#&+=; ~:é") + ["..", "%2F", "%2e%2e", "/../"]),
               min_size=1, max_size=10).map(lambda parts: "".join(parts).strip()).filter(
    lambda s: id_problem("id", s) is None)


@SETTINGS
@given(ids, ids)
def test_any_workflow_id_reaches_its_own_page(header_inbox: str, workflow_id: str,
                                             call_id: str) -> None:
    link = call_url(workflow_id, call_id)
    # As a browser resolves the link against the page it is on.
    resolved = httpx.URL(header_inbox + "/decided").join(link)
    assert resolved.path == "/call"
    assert dict(resolved.params) == {"workflow": workflow_id, "call": call_id}
    page = Peer(header_inbox, PROXY).request("GET", str(resolved), [_user("carol")])
    assert page.status_code == 200, page.text[:500]
    assert f"<h1>Call {escape(call_id)}</h1>" in page.text
    assert f"turn {escape(workflow_id)} ·" in page.text


def test_uvicorns_default_would_be_fooled_and_the_products_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temporal_server: DevServer) -> None:
    """Why `server` turns uvicorn's proxy handling off: with uvicorn's defaults
    (proxy_headers on, FORWARDED_ALLOW_IPS 127.0.0.1) the spoof names the
    trusted proxy; served as the product serves it, it does not."""
    import uvicorn

    _header_env(monkeypatch)
    spoof = [("X-Forwarded-For", b"10.0.0.5"), _user("mallory")]
    app = build_app(_settings(temporal_server, "no-worker", f"sqlite:///{tmp_path}/d.db"))
    port = free_port()
    default = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                            log_level="warning"))
    thread = threading.Thread(target=default.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if default.started:
                break
            time.sleep(0.02)
        fooled = Peer(f"http://127.0.0.1:{port}", OUTSIDE).request("GET", "/decided", spoof)
    finally:
        default.should_exit = True
        thread.join(10)
    assert fooled.status_code == 200 and 'reviewing as <b id="reviewer">mallory' in fooled.text
    with serving(app) as base:
        refused = Peer(base, OUTSIDE).request("GET", "/decided", spoof)
    assert refused.status_code == 400 and "mallory" not in refused.text
