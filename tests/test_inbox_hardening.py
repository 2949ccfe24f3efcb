"""The inbox's hardening (turnstile.inbox.security), through a real dev
server, worker and the strict fake model: a repeated or folded identity
header is refused and decides nothing; the header counts only when bound to
the proxy (shared secret, trusted address); a request without identity sees
no personal data; no page can be framed and no inline script runs without
the page's nonce; a workflow id with "/" is listed, opened and decided, and
the decided call's page says who decided; a turn whose worker is gone is one
row of the list, which still answers at once; unsafe settings refuse to
start. What the inbox reads from the database (the conversation's messages,
the decisions) is read on SQLite and PostgreSQL (the `db` fixture)."""

from __future__ import annotations

import asyncio
import html
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from temporalio.client import Client

from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker, wait_pending
from tests.test_client import plain_service
from tests.test_inbox import _get, _listed, _post, _settings, call_link, inbox_client, login
from turnstile.client import TurnstileClient
from turnstile.engine.contract import TurnStatus
from turnstile.inbox.security import InboxConfigError, InboxSecurity, check_host
from turnstile.inbox.web_app import build_app
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

ROOT = Path(__file__).resolve().parents[1]
SECRET = "from-the-proxy"


def _token(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found is not None, page[:2000]
    return found.group(1)


def _header_env(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    monkeypatch.setenv("TURNSTILE_INBOX_IDENTITY_HEADER", "X-Forwarded-User")
    monkeypatch.setenv("TURNSTILE_INBOX_SECRET", "stable-secret")
    monkeypatch.delenv("TURNSTILE_INBOX_PROXY_SECRET", raising=False)
    monkeypatch.delenv("TURNSTILE_INBOX_TRUSTED_PROXIES", raising=False)
    for key, value in extra.items():
        monkeypatch.setenv(key, value)


async def test_header_mode_one_bound_identity_and_nothing_for_anonymous(
        client: Client, temporal_server: DevServer, task_queue: str, db: Database,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _header_env(monkeypatch, TURNSTILE_INBOX_PROXY_SECRET=SECRET)
    requester = f"carol-{uuid.uuid4().hex[:4]}"
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com",
                                                          "amount": 4})),
                    text_reply("paid"))
    async with running_worker(client, task_queue, db.url,
                              [plain_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob for the renewal", user=requester, service="test")
        await wait_pending(handle)
        call = call_link(handle.id, "p1")
        with inbox_client(build_app(_settings(temporal_server, task_queue, db.url))) as tc:
            # Anonymous: no data at all, on every page.
            for url in ("/", "/rows", "/decided", call):
                page = await _get(tc, url)
                assert page.status_code == 401, url
                for personal in (requester, "bob@", "renewal", handle.id):
                    assert personal not in page.text, (url, personal)
            ops = {"X-Forwarded-User": "ops-lead", "X-Turnstile-Proxy-Secret": SECRET}
            page = (await _get(tc, call, headers=ops)).text
            token = _token(page)
            # The reviewer sees the conversation's recent messages (from the database).
            assert 'id="messages"' in page and "pay bob for the renewal" in page
            # The proxy appended its header after the client's own: refused.
            repeated = [("X-Forwarded-User", "ops-lead"), ("X-Forwarded-User", requester),
                        ("X-Turnstile-Proxy-Secret", SECRET)]
            refused = await _post(tc, call, headers=repeated,
                                  data={"decision": "approve", "csrf": token})
            assert refused.status_code == 400 and "exactly one reviewer" in refused.text
            folded = {**ops, "X-Forwarded-User": f"ops-lead, {requester}"}
            assert (await _post(tc, call, headers=folded, data={
                "decision": "approve", "csrf": token})).status_code == 400
            # Without the proxy's secret (or with another) the header is not believed.
            for secret in (None, "guessed"):
                unbound = {"X-Forwarded-User": "ops-lead",
                           **({"X-Turnstile-Proxy-Secret": secret} if secret else {})}
                page = await _post(tc, call, headers=unbound,
                                   data={"decision": "approve", "csrf": token})
                assert page.status_code == 400 and "the proxy&#39;s secret" in page.text
            # None of these decided anything: the call still waits.
            assert [p.tool_call_id for p in await turns_pending(client, task_queue, handle.id)
                    ] == ["p1"]
            done = await _post(tc, call, headers=ops, data={
                "decision": "approve", "note": "ok", "csrf": token})
            assert done.status_code == 200 and "approved by ops-lead" in done.text
            result = await handle.result()
            board = (await _get(tc, "/decided", headers=ops)).text
            assert handle.id in board and requester in board and "ops-lead" in board
    assert result.status == TurnStatus.COMPLETED


async def turns_pending(client: Client, task_queue: str, workflow_id: str) -> list[Any]:
    tc = TurnstileClient(client, _settings_for(task_queue))
    return await tc.turn(workflow_id).pending()


def _settings_for(task_queue: str) -> Any:
    from turnstile.runtime.config import Settings

    return Settings.from_env({"TURNSTILE_TASK_QUEUE": task_queue})


def test_the_header_only_from_the_trusted_proxy_address(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TURNSTILE_INBOX_TRUSTED_PROXIES: the header of any other peer is refused
    (before any turn is asked: no server needed)."""
    _header_env(monkeypatch, TURNSTILE_INBOX_TRUSTED_PROXIES="10.9.0.0/16, 127.0.0.1")
    security = InboxSecurity.from_env()
    app = build_app()
    who = {"X-Forwarded-User": "dave"}
    with TestClient(app, client=("192.0.2.7", 4000), follow_redirects=False) as outside:
        page = outside.get("/decided", headers=who)
        assert page.status_code == 400 and "only from the configured proxy" in page.text
    with TestClient(app, client=("10.9.3.4", 4000), follow_redirects=False) as proxy:
        assert "reviewing as" in proxy.get("/decided", headers=who).text
    assert security.trusted and security.proxy_secret is None


def test_unsafe_settings_refuse_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    _header_env(monkeypatch, TURNSTILE_INBOX_PROXY_SECRET=SECRET)
    monkeypatch.delenv("TURNSTILE_INBOX_SECRET")
    with pytest.raises(InboxConfigError, match="TURNSTILE_INBOX_SECRET"):
        InboxSecurity.from_env()
    _header_env(monkeypatch)
    with pytest.raises(InboxConfigError, match="nothing binds"):
        InboxSecurity.from_env()
    with pytest.raises(InboxConfigError, match="not an address"):
        InboxSecurity.from_env({"TURNSTILE_INBOX_TRUSTED_PROXIES": "proxy.local"})
    dev = InboxSecurity.from_env({})
    for host in ("0.0.0.0", "192.0.2.1", "inbox.example.com"):
        with pytest.raises(InboxConfigError, match="allow-dev-login-on-network"):
            check_host(host, dev, allow_dev_login_on_network=False)
        check_host(host, dev, allow_dev_login_on_network=True)
    for host in ("127.0.0.1", "::1", "localhost"):
        check_host(host, dev, allow_dev_login_on_network=False)
    # From the command line: a clear refusal, exit 2, nothing served.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}
    ran = subprocess.run([sys.executable, "starter.py", "inbox", "--host", "0.0.0.0",
                          "--port", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 2, ran.stderr
    assert "refusing to start the inbox" in ran.stdout + ran.stderr


def _csp_nonce(response: Any) -> str:
    csp = response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert response.headers["x-frame-options"] == "DENY"
    nonce = re.search(r"'nonce-([^']+)'", csp)
    assert nonce is not None
    # Every script of the page carries the nonce; none is inline.
    for tag, body in re.findall(r"(<script[^>]*>)(.*?)</script>", response.text, re.S):
        assert f'nonce="{nonce.group(1)}"' in tag and "src=" in tag and not body.strip()
    return nonce.group(1)


async def test_a_slash_id_framing_and_the_decided_call(
        client: Client, temporal_server: DevServer, task_queue: str, db: Database,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com",
                                                          "amount": 2})),
                    text_reply("paid"))
    url = db.url
    workflow_id = f"turn-tickets/43-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, task_queue, url, [plain_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob", user="alice", service="test",
                                   conversation=f"tickets/{uuid.uuid4().hex[:4]}",
                                   workflow_id=workflow_id)
        await wait_pending(handle)
        with inbox_client(build_app(_settings(temporal_server, task_queue, url),
                                    secret="s")) as tc:
            nonces = {_csp_nonce(await _get(tc, "/login"))}
            call = call_link(workflow_id, "p1")
            # Not logged in: a call's page is not shown either (development mode).
            assert (await _get(tc, call)).status_code == 303
            await login(tc, "carol")
            listing = await _listed(tc, workflow_id)
            assert f'href="{html.escape(call)}"' in listing
            # A v0.4 link (the id in the path, "/" as is or as %2F) leads to the page.
            for old in (f"/calls/{workflow_id}/p1", f"/calls/{workflow_id.replace('/', '%2F')}/p1"):
                moved = await _get(tc, old)
                assert moved.status_code == 303 and moved.headers["location"] == call
            page = await _get(tc, call)
            assert page.status_code == 200 and "sendMoneySlowly for alice" in page.text
            nonces.add(_csp_nonce(page))
            assert len(nonces) == 2  # a nonce per answer
            # A decision POSTed to the contract's route (/calls/ID/CALL) is taken.
            done = await _post(tc, f"/calls/{workflow_id}/p1",
                               data={"decision": "approve", "note": "fine",
                                     "csrf": _token(page.text)})
            assert done.status_code == 200 and "approved by carol" in done.text
            assert "fine" in done.text and 'id="next"' in done.text
            result = await handle.result()
            decided = (await _get(tc, call)).text
            assert re.search(r"Decided: <b>approved</b> by <b>carol</b>", decided), decided
            board = (await _get(tc, "/decided?q=TICKETS/43")).text
            assert workflow_id in board and "carol" in board and "fine" in board
    assert result.status == TurnStatus.COMPLETED


async def test_a_turn_whose_worker_is_gone_is_one_row(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    fake_llm.default = lambda req: (text_reply("paid") if any(
        m["role"] == "tool" for m in req["messages"]) else tool_reply(
        ("p1", "sendMoneySlowly", {"to": "bob@example.com", "amount": 1})))
    gone_queue = f"{task_queue}-gone"
    async with running_worker(client, gone_queue, f"sqlite:///{tmp_path}/g.db",
                              [plain_service()], llm_url=fake_llm.url) as turns:
        orphan = await turns.start("pay", user="erin", service="test")
        await wait_pending(orphan)
    # Its worker is gone; the turn still says it waits (its search attributes).
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [plain_service()], llm_url=fake_llm.url) as turns:
        alive = await turns.start("pay", user="frank", service="test")
        await wait_pending(alive)
        with inbox_client(build_app(_settings(temporal_server, task_queue), secret="s")) as tc:
            await login(tc, "carol")
            page = ""
            for _ in range(100):  # visibility is eventually consistent
                started = time.monotonic()
                response = await _get(tc, "/rows")
                took = time.monotonic() - started
                page = response.text
                listed = html.escape(call_link(alive.id, "p1")) in page
                if listed and f"{orphan.id} did not answer" in page:
                    break
                await asyncio.sleep(0.1)
            assert response.status_code == 200
            assert f"{orphan.id} did not answer" in page and "did not answer within" in page
            assert took < 5, f"the list took {took:.1f} s"
        await client.get_workflow_handle(alive.id).signal("approve", {
            "tool_call_id": "p1", "reviewer": "carol"})
        await client.get_workflow_handle(alive.id).result()
    await client.get_workflow_handle(orphan.id).terminate(reason="test: its worker is gone")
    _ = _post  # (the decision forms are tested in the tests above)
