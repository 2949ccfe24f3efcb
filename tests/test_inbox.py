"""The approvals inbox (turnstile.inbox) against a real dev server, worker and
the strict fake model: a pending call listed across turns with its full
arguments escaped, the development login (with its CSRF token), CSRF on
decisions, the requester's own call refused with its reason, a decision that
takes effect, and the proxy-header identity; what the pages read from the
database (the conversation's messages, the decision) on SQLite and
PostgreSQL. The hardening has its own file (tests/test_inbox_hardening.py)."""

from __future__ import annotations

import asyncio
import html
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from temporalio.client import Client

from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker, wait_pending
from tests.test_client import plain_service
from turnstile.engine.contract import TurnStatus
from turnstile.inbox.views import call_url
from turnstile.inbox.web_app import build_app
from turnstile.runtime.config import Settings
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry, tool
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

XSS = "<script>alert('x')</script>"


async def _pending_turn(turns: Any, user: str) -> Any:
    handle = await turns.start("pay bob", user=user, service="test", variables={})
    await wait_pending(handle)
    return handle


def _settings(server: DevServer, queue: str, database_url: str | None = None) -> Settings:
    return Settings.from_env({"TEMPORAL_ADDRESS": server.address,
                              "TURNSTILE_TASK_QUEUE": queue,
                              **({"DATABASE_URL": database_url} if database_url else {})})


def call_link(workflow_id: str, call_id: str) -> str:
    """A call's page, as the inbox links it (ids as query parameters)."""
    return call_url(workflow_id, call_id)


def inbox_client(app: Any, **kw: Any) -> TestClient:
    """The inbox as a browser on https reaches it (cookies are `Secure` there)."""
    return TestClient(app, base_url="https://testserver", follow_redirects=False, **kw)


async def login(tc: TestClient, name: str) -> Any:
    """The development login as a browser does it: the form (its CSRF token), then the post."""
    tc.cookies.clear()
    form = (await _get(tc, "/login")).text
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', form)
    assert token is not None, form
    return await _post(tc, "/login", data={"name": name, "csrf": token.group(1)})


async def _get(tc: TestClient, url: str, **kw: Any) -> Any:
    return await asyncio.to_thread(tc.get, url, **kw)


async def _post(tc: TestClient, url: str, **kw: Any) -> Any:
    return await asyncio.to_thread(tc.post, url, **kw)


async def _listed(tc: TestClient, workflow_id: str, **kw: Any) -> str:
    page = ""
    for _ in range(100):  # visibility is eventually consistent
        page = (await _get(tc, "/", **kw)).text
        if html.escape(call_link(workflow_id, "")) in page:
            return page
        await asyncio.sleep(0.1)
    raise AssertionError(f"{workflow_id} not listed: {page[:2000]}")


async def test_review_in_the_browser_development_login(
        client: Client, temporal_server: DevServer, task_queue: str, db: Database,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": f"bob{XSS}@example.com",
                                                          "amount": 7})),
                    text_reply("paid"))
    async with running_worker(client, task_queue, db.url,
                              [plain_service()], llm_url=fake_llm.url) as turns:
        handle = await _pending_turn(turns, "alice")
        with inbox_client(build_app(_settings(temporal_server, task_queue, db.url),
                                    secret="s")) as tc:
            assert (await _get(tc, "/")).status_code == 303  # who are you?
            # The login form carries a CSRF token: a post without it is refused.
            assert (await _post(tc, "/login", data={"name": "carol"})).status_code == 403
            assert (await login(tc, "bob\u200b")).status_code == 400
            assert (await login(tc, "carol")).status_code == 303
            await _listed(tc, handle.id)  # carol's inbox lists alice's call
            await login(tc, "alice")
            own = (await _get(tc, "/")).text  # alice's own call is not in her inbox ...
            assert html.escape(call_link(handle.id, "p1")) not in own
            detail = (await _get(tc, call_link(handle.id, "p1"))).text
            # Shown in full, escaped (as JSON escapes inside the arguments block).
            assert XSS not in detail
            assert "\\u003cscript\\u003e" in detail or "&lt;script&gt;" in detail
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', detail)
            assert csrf is not None
            # ... and deciding it is refused with the turn's reason.
            refused = await _post(tc, call_link(handle.id, "p1"),
                                  data={"decision": "approve", "csrf": csrf.group(1)})
            assert refused.status_code == 409 and "requested this call" in refused.text
            forged = await _post(tc, call_link(handle.id, "p1"),
                                 data={"decision": "approve", "csrf": "0" * 64})
            assert forged.status_code == 403
            # Carol, in her own session, approves.
            await login(tc, "carol")
            detail = (await _get(tc, call_link(handle.id, "p1"))).text
            # The conversation's recent messages, read from the database.
            assert 'id="messages"' in detail and "pay bob" in detail
            token = re.search(r'name="csrf" value="([0-9a-f]+)"', detail)
            assert token is not None
            done = await _post(tc, call_link(handle.id, "p1"),
                               data={"decision": "approve", "note": "ok", "csrf": token.group(1)})
            assert done.status_code == 200 and "sendMoneySlowly approved by carol" in done.text
            result = await handle.result()
            # The decided call's page says who decided, from `approval_decision`.
            decided = (await _get(tc, call_link(handle.id, "p1"))).text
            assert re.search(r"Decided: <b>approved</b> by <b>carol</b>", decided), decided
    assert result.status == TurnStatus.COMPLETED


async def test_identity_from_the_proxy_header(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNSTILE_INBOX_IDENTITY_HEADER", "X-Forwarded-User")
    monkeypatch.setenv("TURNSTILE_INBOX_PROXY_SECRET", "from-the-proxy")
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com", "amount": 1})),
                    text_reply("paid"))
    url = f"sqlite:///{tmp_path}/t.db"
    async with running_worker(client, task_queue, url,
                              [plain_service()], llm_url=fake_llm.url) as turns:
        handle = await _pending_turn(turns, f"u-{uuid.uuid4().hex[:4]}")
        with inbox_client(build_app(_settings(temporal_server, task_queue, url),
                                    secret="s")) as tc:
            anonymous = await _post(tc, call_link(handle.id, "p1"), data={"decision": "approve"})
            assert anonymous.status_code == 401
            assert (await _get(tc, "/login")).status_code == 404
            who = {"X-Forwarded-User": "dave", "X-Turnstile-Proxy-Secret": "from-the-proxy"}
            await _listed(tc, handle.id, headers=who)
            detail = (await _get(tc, call_link(handle.id, "p1"), headers=who)).text
            token = re.search(r'name="csrf" value="([0-9a-f]+)"', detail)
            assert token is not None
            done = await _post(tc, call_link(handle.id, "p1"), headers=who,
                               data={"decision": "reject", "note": "no", "csrf": token.group(1)})
            assert "rejected by dave" in done.text
        result = await handle.result()
    assert result.tool_calls[0].status.value == "rejected"


@tool(requires_approval=True, idempotent=True, review_fields=("to", "amount"),
      approval_timeout_seconds=600)
def payReviewed(to: str, amount: int) -> dict[str, Any]:  # noqa: N802
    """Pay someone (the recipient and the amount are review fields)."""
    return {"paid": amount, "to": to}


async def test_an_integer_review_field_is_edited_in_place(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    fake_llm.script(tool_reply(("p1", "payReviewed", {"to": "bob", "amount": 7})),
                    text_reply("paid"))
    url = f"sqlite:///{tmp_path}/t.db"
    service = Service(name="test", system_prompt="You pay.", tools=ToolRegistry([payReviewed]))
    async with running_worker(client, task_queue, url, [service],
                              llm_url=fake_llm.url) as turns:
        handle = await _pending_turn(turns, "alice")
        call = call_link(handle.id, "p1")
        with inbox_client(build_app(_settings(temporal_server, task_queue, url),
                                    secret="s")) as tc:
            await login(tc, "carol")
            page = (await _get(tc, call)).text
            field = re.search(r'<input id="edit-amount" name="edit.amount" value="([^"]*)"[^>]*>',
                              page)
            assert field is not None and field.group(1) == "7", page
            assert 'inputmode="decimal"' in field.group(0)
            token = re.search(r'id="decide"[^>]*>\s*<input type="hidden" name="csrf" '
                              r'value="([0-9a-f]+)"', page)
            assert token is not None
            form = {"decision": "approve", "csrf": token.group(1), "edit.to": "bob"}
            wrong = await _post(tc, call, data={**form, "edit.amount": "12.5"})
            assert wrong.status_code == 400 and "amount must be a whole number" in wrong.text
            done = await _post(tc, call, data={**form, "edit.amount": "12"})
            assert done.status_code == 200 and "payReviewed approved by carol" in done.text
            assert re.search(r'id="edited">with your edits: amount<', done.text), done.text
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED
    told = [m for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert told and '"paid": 12' in told[-1]["content"].replace('"paid":12', '"paid": 12')
