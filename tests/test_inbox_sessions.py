"""The inbox's development sessions (turnstile.inbox.security): a signed
cookie with a random session id and its issue time, `Max-Age` and the issue
time checked by the server; `Secure` over https and from anywhere but a
loopback peer on plain http (or as TURNSTILE_INBOX_SECURE_COOKIE says); a
CSRF token random per login and bound to the session's cookie; logout. Pages
that read the database only (`/decided`, a real SQLite file): no Temporal
server needed."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from turnstile.inbox.security import COOKIE, LOGIN_COOKIE, InboxConfigError, InboxSecurity
from turnstile.inbox.web_app import build_app
from turnstile.runtime.config import Settings


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key in ("TURNSTILE_INBOX_IDENTITY_HEADER", "TURNSTILE_INBOX_SECURE_COOKIE",
                "TURNSTILE_INBOX_SESSION_HOURS"):
        monkeypatch.delenv(key, raising=False)
    return build_app(Settings.from_env({"DATABASE_URL": f"sqlite:///{tmp_path}/s.db"}),
                     secret="s")


def _login(tc: TestClient, name: str) -> Any:
    form = tc.get("/login").text  # its own form's token (the page may have a logout form)
    token = re.search(r'action="/login">\s*<input type="hidden" name="csrf" value="([0-9a-f]+)"',
                      form)
    assert token is not None, form
    return tc.post("/login", data={"name": name, "csrf": token.group(1)})


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]*)"', page)
    assert found is not None, page[:1000]
    return found.group(1)


def _set_cookie(response: Any, name: str) -> str:
    lines = [c for c in response.headers.get_list("set-cookie") if c.startswith(name + "=")]
    assert len(lines) == 1, response.headers
    return lines[0].lower()


@pytest.mark.parametrize(("base", "peer", "setting", "secure"), [
    ("https://testserver", "203.0.113.9", None, True),
    ("http://testserver", "127.0.0.1", None, False),  # the local browser, development
    ("http://testserver", "::1", None, False),
    ("http://testserver", "203.0.113.9", None, True),
    ("http://testserver", "127.0.0.1", "true", True),
    ("https://testserver", "203.0.113.9", "false", False),
])
def test_the_session_cookie(app: Any, monkeypatch: pytest.MonkeyPatch, base: str, peer: str,
                            setting: str | None, secure: bool) -> None:
    if setting:
        app.state.inbox.security.secure_cookie = setting
    with TestClient(app, base_url=base, client=(peer, 5000), follow_redirects=False) as tc:
        form = tc.get("/login")
        assert ("; secure" in _set_cookie(form, LOGIN_COOKIE)) is secure
        if secure and base.startswith("http:"):
            # A browser would not send it back over http: the login says why.
            refused = tc.post("/login", data={"name": "carol", "csrf": _csrf(form.text)})
            assert refused.status_code == 403 and "TURNSTILE_INBOX_SECURE_COOKIE" in refused.text
            return
        answer = _login(tc, "carol")
        assert answer.status_code == 303
        cookie = _set_cookie(answer, COOKIE)
        assert ("; secure" in cookie) is secure, cookie
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert "max-age=43200" in cookie and "path=/" in cookie
        assert "reviewing as" in tc.get("/decided").text


def test_csrf_is_random_per_login_and_bound_to_the_session(app: Any) -> None:
    with TestClient(app, base_url="https://testserver", follow_redirects=False) as one, \
            TestClient(app, base_url="https://testserver", follow_redirects=False) as two:
        _login(one, "carol")
        first = _csrf(one.get("/decided").text)
        assert first == _csrf(one.get("/decided").text)  # one per session
        _login(two, "carol")
        second = _csrf(two.get("/decided").text)
        assert first and second and first != second  # not a function of the name
        # One session's token with the other's cookie is refused (logout is a form).
        assert two.post("/logout", data={"csrf": first}).status_code == 403
        _login(one, "carol")  # a new login: a new session, a new token
        assert _csrf(one.get("/decided").text) not in (first, second)


def test_a_session_ends_when_its_signed_issue_time_is_old(app: Any) -> None:
    security: InboxSecurity = app.state.inbox.security
    with TestClient(app, base_url="https://testserver", follow_redirects=False) as tc:
        _login(tc, "carol")
        assert tc.get("/decided").status_code == 200
        raw = tc.cookies[COOKIE]
        sid, issued, rest = raw.split(".", 2)
        # The browser kept the cookie past its Max-Age: the server ends it too.
        security.clock = lambda: time.time() + 12 * 3600 + 1
        assert tc.get("/decided").status_code == 303
        security.clock = time.time
        assert tc.get("/decided").status_code == 200
        tc.cookies.clear()
        assert tc.get("/decided", headers={"Cookie": f"{COOKIE}={raw}"}).status_code == 200
        # An issue time rewritten without the secret: not a session.
        forged = f"{sid}.{int(issued) + 3600}.{rest}"
        assert tc.get("/decided", headers={"Cookie": f"{COOKIE}={forged}"}).status_code == 303


def test_logout(app: Any) -> None:
    with TestClient(app, base_url="https://testserver", follow_redirects=False) as tc:
        _login(tc, "carol")
        page = tc.get("/decided").text
        assert 'id="logout"' in page
        assert tc.post("/logout", data={"csrf": "0" * 64}).status_code == 403
        out = tc.post("/logout", data={"csrf": _csrf(page)})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert "max-age=0" in _set_cookie(out, COOKIE)
        assert COOKIE not in tc.cookies
        assert tc.get("/decided").status_code == 303


def test_session_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    security = InboxSecurity.from_env({"TURNSTILE_INBOX_SESSION_HOURS": "0.5",
                                       "TURNSTILE_INBOX_SECURE_COOKIE": "TRUE"})
    assert security.session_seconds == 1800 and security.secure_cookie == "true"
    for bad in ({"TURNSTILE_INBOX_SESSION_HOURS": "0"}, {"TURNSTILE_INBOX_SESSION_HOURS": "x"},
                {"TURNSTILE_INBOX_SECURE_COOKIE": "maybe"}):
        with pytest.raises(InboxConfigError):
            InboxSecurity.from_env(bad)
