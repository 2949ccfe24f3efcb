"""Reviewing in a real browser: Debian's Chromium, headless, driven by
Selenium, on the inbox served by uvicorn, against a real dev server, worker,
fake model and SMTP server. A sales turn waits on an e-mail whose subject the
model wrote with a <script> in it; the page lists it; the requester's own
approval is refused with the reason shown; another reviewer approves; the
turn completes and exactly one mail arrives. The subject renders as text.

A second reviewer edits the e-mail in place: an outside recipient is
refused on the page (the call stays pending, the edit stays in the form),
then a recipient inside the allow-list and a new subject are approved; the
mail that arrives over SMTP carries the edits, the audit has an
APPROVED_WITH_EDITS row, the model's next request says what was edited (a
note after the tool's own result) and the "decided" view shows it, with the
arguments it ran with (masked).

A masked field is edited in the JSON editor, on a turn whose workflow id has
dot segments (`turn-x/../../decided`, reached from the list's link): the mail
that arrives carries the real body with only the edited parts changed.
Identity headers sent by Chromium itself (DevTools protocol), with the inbox
served as the product serves it (app.server): `X-Forwarded-For: 10.0.0.5` and
a forwarded-for chain from 127.0.0.1 are refused with a trusted proxy of
10.0.0.5; `Ölaf` (UTF-8) may not approve `ölaf`'s call; the mojibake
`Ã\x96laf` names nobody; `Zoë` approves; each refusal is logged.

`ТОМ` (Cyrillic capitals) is tom: the list offers ТОМ dave's call, not tom's;
tom's call's page, opened directly, refuses ТОМ's approval (audited,
APPROVAL_REFUSED), the call stays pending, and carol approves it.

A loans desk whose model is a Python function (tests/test_approval_edits.py):
carol changes the loan's member in place and approves; the function reads
the tool's own result as a dict, with carol's edit beside it, and the loan
row is the edited member's.

With TURNSTILE_SCREENSHOTS=DIR the list and detail pages are saved there as
PNG (docs/ holds the ones the README shows)."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.support.processes import free_port
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker, wait_pending
from turnstile.engine.contract import TurnStatus
from turnstile.inbox import records
from turnstile.inbox.views import call_url
from turnstile.inbox.web_app import build_app, server
from turnstile.runtime.config import Settings
from turnstile.sales.sender import SenderConfig, deliver_due
from turnstile.sales.service import build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
SUBJECT = "Renewal <script>document.title='owned'</script> for Q4"


def _replaced(page: Any) -> Any:
    """A wait condition: the page's old root element left the document.
    Selenium's staleness_of only knows StaleElementReferenceException; while
    the next page loads, ChromeDriver can answer for the old node with an
    "unknown error ... does not belong to the document" instead, which means
    the same thing (seen once in CI)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    def gone(_driver: Any) -> bool:
        try:
            page.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as error:
            if "does not belong to the document" in str(error.msg):
                return True
            raise
        return False
    return gone


class Browser:
    def __init__(self, base: str, shots: Path | None) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service as DriverService

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM or ""
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--window-size=1280,900"):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(options=options, service=DriverService(DRIVER or ""))
        self.base, self.shots = base, shots

    def login(self, name: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver.get(f"{self.base}/login")  # the form sets its CSRF cookie
        self.driver.find_element(By.NAME, "name").send_keys(name)
        self.driver.find_element(By.ID, "login").click()
        self.wait_for("reviewer")  # the login's redirect has landed, the cookie is set

    def open_call(self, workflow_id: str, call_id: str, shot: str | None = None) -> None:
        from selenium.webdriver.common.by import By

        link = call_url(workflow_id, call_id)
        for _ in range(100):  # the list refreshes itself; visibility catches up
            self.driver.get(f"{self.base}/")
            found = self.driver.find_elements(By.CSS_SELECTOR, f'a[href="{link}"]')
            if found:
                if shot and self.shots:
                    self.driver.save_screenshot(str(self.shots / f"{shot}-list.png"))
                found[0].click()
                if shot and self.shots:
                    self.driver.save_screenshot(str(self.shots / f"{shot}-call.png"))
                return
            time.sleep(0.2)
        raise AssertionError("the pending call never appeared in the inbox")

    def decide(self, button: str, note: str) -> str:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.wait_for("note").send_keys(note)
        page = self.driver.find_element(By.TAG_NAME, "html")
        self.driver.find_element(By.ID, button).click()
        WebDriverWait(self.driver, 20).until(_replaced(page))  # the answer's page
        return str(self.wait_for("outcome").text)

    def wait_for(self, name: str) -> Any:
        """The element with this id (or name) once the page that has it loaded."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        wait = WebDriverWait(self.driver, 20)
        return wait.until(ec.any_of(ec.presence_of_element_located((By.ID, name)),
                                    ec.presence_of_element_located((By.NAME, name))))

    def text(self, element_id: str) -> str:
        from selenium.webdriver.common.by import By

        return str(self.driver.find_element(By.ID, element_id).text)


def _review(base: str, workflow_id: str, shots: Path | None) -> dict[str, Any]:
    browser = Browser(base, shots)
    try:
        # The requester herself: the page lets her try, the turn refuses.
        browser.login("alice")
        browser.driver.get(base + call_url(workflow_id, "e1"))
        refused = browser.decide("approve", "my own")
        # Another reviewer, from the list.
        browser.login("carol")
        browser.open_call(workflow_id, "e1", shot="inbox")
        # The subject, a review field, is edited in place: its text is the input's value.
        arguments = browser.wait_for("edit-subject").get_attribute("value")
        title = str(browser.driver.title)
        left = browser.text("left")
        message = browser.text("message")
        approved = browser.decide("approve", "fine by me")
        return {"refused": refused, "approved": approved, "arguments": arguments,
                "title": title, "left": left, "message": message}
    finally:
        browser.driver.quit()


@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="Debian's chromium and chromium-driver are not installed "
                           "(.ci/run installs them)")
async def test_a_reviewer_approves_in_the_browser(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    mail = {"to": "ops@example.com", "subject": SUBJECT, "body": "Please renew."}
    fake_llm.script(tool_reply(("e1", "createEmailTask", mail)), text_reply("queued"))
    port, smtp = free_port(), free_port()
    settings = Settings.from_env({"TEMPORAL_ADDRESS": temporal_server.address,
                                  "TURNSTILE_TASK_QUEUE": task_queue,
                                  "DATABASE_URL": f"sqlite:///{tmp_path}/t.db"})
    inbox = server(build_app(settings), "127.0.0.1", port, log_level="warning")
    serving = threading.Thread(target=inbox.run, daemon=True)
    shots = Path(os.environ["TURNSTILE_SCREENSHOTS"]) if os.environ.get(
        "TURNSTILE_SCREENSHOTS") else None
    smtp_env = {"SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(smtp)}
    with LocalSmtpServer(tmp_path / "mail", port=smtp):
        async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                                  [build_sales_service()], llm_url=fake_llm.url,
                                  env=smtp_env) as turns:
            handle = await turns.start("remind ops about the renewal", user="alice",
                                       service="sales-assistant")
            await wait_pending(handle)
            serving.start()
            try:
                seen = await asyncio.to_thread(_review, f"http://127.0.0.1:{port}",
                                               handle.id, shots)
            finally:
                inbox.should_exit = True
                await asyncio.to_thread(serving.join, 10)
            result = await handle.result()
            sent = deliver_due(turns.rt.db, Settings.from_env(
                {"DATABASE_URL": turns.rt.db.url, **smtp_env}), SenderConfig())
        mails = read_mailbox(tmp_path / "mail")
    assert "Refused" in seen["refused"] and "requested this call" in seen["refused"]
    assert "createEmailTask approved by carol" in seen["approved"]
    assert "<script>" in seen["arguments"]  # the model's markup, shown as text ...
    assert seen["title"] != "owned"  # ... never run
    assert "left" in seen["left"]  # the deadline counts down
    assert seen["message"] == "remind ops about the renewal"  # what the user asked
    assert result.status == TurnStatus.COMPLETED
    assert sent == 1 and len(mails) == 1 and mails[0]["To"] == "ops@example.com"


def _edit(base: str, workflow_id: str, shots: Path | None) -> dict[str, Any]:
    from selenium.webdriver.common.by import By

    browser = Browser(base, shots)
    seen: dict[str, Any] = {}
    try:
        browser.login("carol")
        browser.open_call(workflow_id, "e1", shot="inbox" if shots else None)
        body = browser.driver.find_elements(By.CSS_SELECTOR, "#arguments .text.value")
        seen["body"] = [str(b.text) for b in body]
        seen["messages"] = browser.text("messages")

        def set_field(name: str, value: str) -> None:
            field = browser.wait_for(f"edit-{name}")
            field.clear()
            field.send_keys(value)

        set_field("to", "boss@outside.org")
        seen["outside"] = browser.decide("approve", "to the boss")
        seen["kept"] = browser.wait_for("edit-to").get_attribute("value")
        set_field("to", "sales@example.com")
        set_field("subject", "Renewal for Q4 (edited)")
        browser.wait_for("note").clear()
        seen["approved"] = browser.decide("approve", "sales handles it")
        seen["edited"] = browser.text("edited")
        browser.driver.get(f"{base}/decided")
        seen["decided"] = str(browser.wait_for("decided").text)
        return seen
    finally:
        browser.driver.quit()


@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="Debian's chromium and chromium-driver are not installed "
                           "(.ci/run installs them)")
async def test_a_reviewer_edits_the_mail_and_approves_in_the_browser(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.sql import fetchall

    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    body = "Hello ops,\nplease renew the contract.\n\nThanks"
    mail = {"to": "ops@example.com", "subject": "Renewal for Q4", "body": body}
    fake_llm.script(tool_reply(("e1", "createEmailTask", mail)), text_reply("queued"))
    port, smtp = free_port(), free_port()
    database_url = f"sqlite:///{tmp_path}/t.db"
    settings = Settings.from_env({"TEMPORAL_ADDRESS": temporal_server.address,
                                  "TURNSTILE_TASK_QUEUE": task_queue,
                                  "DATABASE_URL": database_url})
    inbox = server(build_app(settings), "127.0.0.1", port, log_level="warning")
    serving = threading.Thread(target=inbox.run, daemon=True)
    smtp_env = {"SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(smtp)}
    with LocalSmtpServer(tmp_path / "mail", port=smtp):
        async with running_worker(client, task_queue, database_url,
                                  [build_sales_service()], llm_url=fake_llm.url,
                                  env=smtp_env) as turns:
            handle = await turns.start("remind ops about the renewal", user="alice",
                                       service="sales-assistant")
            await wait_pending(handle)
            serving.start()
            try:
                seen = await asyncio.to_thread(_edit, f"http://127.0.0.1:{port}",
                                               handle.id, None)
            finally:
                inbox.should_exit = True
                await asyncio.to_thread(serving.join, 10)
            result = await handle.result()
            sent = deliver_due(turns.rt.db, Settings.from_env(
                {"DATABASE_URL": turns.rt.db.url, **smtp_env}), SenderConfig())
            with turns.rt.db.connect() as conn:
                audit = fetchall(conn, "SELECT status, input_params, error_message FROM "
                                       "tool_execution_log WHERE workflow_id = :w",
                                 {"w": handle.id})
        mails = read_mailbox(tmp_path / "mail")
    # The body as text, with its line breaks; the user's message beside it.
    assert any("please renew the contract.\n\nThanks" in b for b in seen["body"]), seen
    assert "remind ops about the renewal" in seen["messages"]
    # An outside recipient: refused on the page, the edit kept to be corrected.
    assert "Refused" in seen["outside"] and "outside.org" in seen["outside"], seen
    assert seen["kept"] == "boss@outside.org"
    assert "createEmailTask approved by carol" in seen["approved"]
    assert "subject" in seen["edited"] and "to" in seen["edited"]
    assert "approved with edits" in seen["decided"]
    # ... with the arguments it ran with, from the decision row, masked.
    assert "Renewal for Q4 (edited)" in seen["decided"]
    assert "s***@example.com" in seen["decided"] and "sales@example.com" not in seen["decided"]
    assert result.status == TurnStatus.COMPLETED
    assert sent == 1 and len(mails) == 1
    assert mails[0]["To"] == "sales@example.com"
    assert mails[0]["Subject"] == "Renewal for Q4 (edited)"
    edited = [row for row in audit if row["status"] == "APPROVED_WITH_EDITS"]
    assert len(edited) == 1 and "subject" in edited[0]["error_message"]
    # The tool message is the tool's own result; the edit is a note after it.
    wire = fake_llm.requests[-1]["messages"]
    [i] = [n for n, m in enumerate(wire) if m["role"] == "tool"][-1:]
    assert wire[i + 1]["role"] == "user" and "edited the arguments" in wire[i + 1]["content"]
    assert "Renewal for Q4 (edited)" in wire[i + 1]["content"]


# -- a masked field edited on the real value; a workflow id with dot segments ------------

MASKED_BODY = ("Hello ops,\nplease renew the contract. Call Ann at +1 415 555 2671 or write to "
               "ann.lee@corp.example.\n\nThanks")


def _edit_masked(base: str, workflow_id: str) -> dict[str, Any]:
    import json

    from selenium.webdriver.common.by import By

    browser = Browser(base, None)
    seen: dict[str, Any] = {}
    try:
        browser.login("carol")
        browser.open_call(workflow_id, "e1")  # the link from the list, clicked
        seen["url"] = str(browser.driver.current_url)
        seen["heading"] = browser.text("turn")
        seen["message"] = browser.text("message")  # what the user asked
        seen["messages"] = browser.text("messages")  # the conversation's recent messages
        seen["shown_body"] = [str(b.text) for b in browser.driver.find_elements(
            By.CSS_SELECTOR, "#arguments .text.value")]
        browser.driver.find_element(By.CSS_SELECTOR, "#decide details summary").click()
        editor = browser.wait_for("arguments_json")
        shown = json.loads(str(editor.get_attribute("value")))
        seen["shown_json"] = shown
        # The reviewer edits the masked body outside its masked parts.
        shown["body"] = shown["body"].replace("Thanks", "Thanks a lot").replace(
            "renew the contract", "renew the contract today")
        editor.clear()
        editor.send_keys(json.dumps(shown, ensure_ascii=False))
        seen["approved"] = browser.decide("approve", "fine")
        seen["edited"] = browser.text("edited")
        return seen
    finally:
        browser.driver.quit()


@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="Debian's chromium and chromium-driver are not installed "
                           "(.ci/run installs them)")
async def test_a_masked_field_is_edited_on_the_real_value_in_the_browser(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    mail = {"to": "ops@example.com", "subject": "Renewal", "body": MASKED_BODY}
    fake_llm.script(tool_reply(("e1", "createEmailTask", mail)), text_reply("queued"))
    port, smtp = free_port(), free_port()
    database_url = f"sqlite:///{tmp_path}/t.db"
    settings = Settings.from_env({"TEMPORAL_ADDRESS": temporal_server.address,
                                  "TURNSTILE_TASK_QUEUE": task_queue,
                                  "DATABASE_URL": database_url})
    # Dot segments: as a path, a browser would resolve this id to "/decided".
    workflow_id = f"turn-{uuid.uuid4().hex[:6]}/../../decided"
    inbox = server(build_app(settings), "127.0.0.1", port, log_level="warning")
    serving = threading.Thread(target=inbox.run, daemon=True)
    smtp_env = {"SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(smtp)}
    with LocalSmtpServer(tmp_path / "mail", port=smtp):
        async with running_worker(client, task_queue, database_url,
                                  [build_sales_service()], llm_url=fake_llm.url,
                                  env=smtp_env) as turns:
            handle = await turns.start("write to ann.lee@corp.example about the renewal",
                                       user="alice", service="sales-assistant",
                                       workflow_id=workflow_id)
            await wait_pending(handle)
            serving.start()
            try:
                seen = await asyncio.to_thread(_edit_masked, f"http://127.0.0.1:{port}",
                                               workflow_id)
            finally:
                inbox.should_exit = True
                await asyncio.to_thread(serving.join, 10)
            result = await handle.result()
            sent = deliver_due(turns.rt.db, Settings.from_env(
                {"DATABASE_URL": turns.rt.db.url, **smtp_env}), SenderConfig())
        mails = read_mailbox(tmp_path / "mail")
    assert "/call?workflow=" in seen["url"] and workflow_id in seen["heading"]
    # The page masks what the user asked, the messages and the body ...
    assert "ann.lee@corp.example" not in str(seen) and "555 2671" not in str(seen)
    assert "@corp.example about the renewal" in seen["message"]
    assert "@corp.example about the renewal" in seen["messages"]
    assert "Thanks" in seen["shown_json"]["body"]
    assert "createEmailTask approved by carol" in seen["approved"] and "body" in seen["edited"]
    assert result.status == TurnStatus.COMPLETED
    # ... and the tool ran with the real body, only the edited parts changed.
    assert sent == 1 and len(mails) == 1
    body = mails[0].get_content().replace("\r\n", "\n").rstrip("\n")
    assert body == MASKED_BODY.replace("Thanks", "Thanks a lot").replace(
        "renew the contract", "renew the contract today")


# -- identity headers from the browser: spoofed peers, encodings ------------------------

def _as_proxy(base: str, workflow_id: str, attempts: list[dict[str, str]]) -> list[str]:
    """Each set of headers sent by the browser itself (Chromium's DevTools
    protocol), on the call's page; what the page said."""
    browser = Browser(base, None)
    said = []
    try:
        browser.driver.execute_cdp_cmd("Network.enable", {})
        for headers in attempts:
            browser.driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})
            browser.driver.get(base + call_url(workflow_id, "p1"))
            page = str(browser.driver.find_element("tag name", "main").text)
            if "decide" in headers.get("X-Test-Action", "") and browser.driver.find_elements(
                    "id", "approve"):
                page = browser.decide("approve", "from the browser")
            said.append(page)
        return said
    finally:
        browser.driver.quit()


@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="Debian's chromium and chromium-driver are not installed "
                           "(.ci/run installs them)")
async def test_spoofed_and_encoded_identity_headers_from_the_browser(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from tests.test_client import plain_service

    caplog.set_level(logging.WARNING, logger="turnstile.inbox.security")
    monkeypatch.setenv("TURNSTILE_INBOX_IDENTITY_HEADER", "X-Forwarded-User")
    monkeypatch.setenv("TURNSTILE_INBOX_SECRET", "stable-secret")
    monkeypatch.delenv("TURNSTILE_INBOX_PROXY_SECRET", raising=False)
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com",
                                                          "amount": 5})),
                    text_reply("paid"))
    database_url = f"sqlite:///{tmp_path}/t.db"
    settings = Settings.from_env({"TEMPORAL_ADDRESS": temporal_server.address,
                                  "TURNSTILE_TASK_QUEUE": task_queue,
                                  "DATABASE_URL": database_url})
    async with running_worker(client, task_queue, database_url, [plain_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob", user="ölaf", service="test")
        await wait_pending(handle)
        # The setting: the proxy is 10.0.0.5; the browser is on 127.0.0.1.
        monkeypatch.setenv("TURNSTILE_INBOX_TRUSTED_PROXIES", "10.0.0.5")
        spoofed_app = build_app(settings)
        # The browser as the proxy: bound by the proxy's secret instead.
        monkeypatch.delenv("TURNSTILE_INBOX_TRUSTED_PROXIES")
        monkeypatch.setenv("TURNSTILE_INBOX_PROXY_SECRET", "from-the-proxy")
        monkeypatch.setenv("TURNSTILE_INBOX_SECURE_COOKIE", "false")  # plain http, locally
        proxied_app = build_app(settings)
        said: dict[str, list[str]] = {}
        for name, app, attempts in (
                ("spoofed", spoofed_app, [
                    {"X-Forwarded-For": "10.0.0.5", "X-Forwarded-User": "mallory",
                     "X-Test-Action": "decide"},
                    {"X-Forwarded-For": "1.2.3.4, 10.0.0.5", "X-Forwarded-User": "mallory",
                     "X-Test-Action": "decide"}]),
                ("proxied", proxied_app, [
                    {"X-Turnstile-Proxy-Secret": "from-the-proxy", "X-Forwarded-User": "Ölaf",
                     "X-Test-Action": "decide"},
                    {"X-Turnstile-Proxy-Secret": "from-the-proxy",
                     "X-Forwarded-User": "Ã\u0096laf", "X-Test-Action": "decide"},
                    {"X-Turnstile-Proxy-Secret": "from-the-proxy", "X-Forwarded-User": "Zoë",
                     "X-Test-Action": "decide"}])):
            port = free_port()
            inbox = server(app, "127.0.0.1", port, log_level="warning")
            serving = threading.Thread(target=inbox.run, daemon=True)
            serving.start()
            try:
                said[name] = await asyncio.to_thread(_as_proxy, f"http://127.0.0.1:{port}",
                                                     handle.id, attempts)
            finally:
                inbox.should_exit = True
                await asyncio.to_thread(serving.join, 10)
        result = await handle.result()
        decisions = [d.reviewer for d in records.recent_decisions(turns.rt.db)
                     if d.workflow_id == handle.id]
    for page in said["spoofed"]:
        assert "only from the configured proxy" in page and "'127.0.0.1'" in page, page
        assert "mallory" not in page
    utf8, mojibake, zoe = said["proxied"]
    assert "Refused" in utf8 and "requested this call" in utf8, utf8  # Ölaf is ölaf
    assert "names no reviewer" in mojibake, mojibake
    assert "sendMoneySlowly approved by Zoë" in zoe, zoe
    assert decisions == ["Zoë"]
    assert result.status == TurnStatus.COMPLETED
    logged = [r.getMessage() for r in caplog.records if r.name == "turnstile.inbox.security"]
    assert sum("only from the configured proxy" in m for m in logged) >= 2, logged
    assert any("names no reviewer" in m for m in logged), logged


# -- ТОМ (Cyrillic capitals) is tom: not offered tom's call, refused on its page ---------

TOM = "\u0422\u041e\u041c"  # ТОМ, which looks like TOM, which is tom in capitals


def _listed(browser: Browser, links: list[str]) -> dict[str, bool]:
    """Which of `links` the list offers the reviewer, once it offers the
    first (the list refreshes itself; visibility catches up)."""
    from selenium.webdriver.common.by import By

    for _ in range(100):
        browser.driver.get(f"{browser.base}/")
        found = {link: bool(browser.driver.find_elements(By.CSS_SELECTOR, f'a[href="{link}"]'))
                 for link in links}
        if found[links[0]]:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{links[0]} never appeared in the inbox")


def _tom_tries(base: str, toms: str, daves: str) -> dict[str, Any]:
    from selenium.webdriver.common.by import By

    browser = Browser(base, None)
    seen: dict[str, Any] = {}
    try:
        tom_link, dave_link = call_url(toms, "e1"), call_url(daves, "e1")
        # Another reviewer's list offers both calls: visibility has them.
        browser.login("carol")
        seen["carol_lists"] = _listed(browser, [tom_link, dave_link])
        browser.login(TOM)
        seen["reviewer"] = browser.text("reviewer")
        # ТОМ's list offers dave's call, not tom's ...
        seen["tom_lists"] = _listed(browser, [dave_link, tom_link])
        # ... and ТОМ may decide dave's.
        browser.open_call(daves, "e1")
        seen["rejected"] = browser.decide("reject", "not now")
        seen["next"] = [str(a.get_attribute("href")) for a in
                        browser.driver.find_elements(By.ID, "next-call")]
        # tom's call, opened directly: the page lets ТОМ try, the turn refuses.
        browser.driver.get(base + tom_link)
        seen["requester"] = str(browser.wait_for("decide").find_element(
            By.XPATH, "preceding::h2[1]").text)
        seen["refused"] = browser.decide("approve", "mine")
        # Still pending: the page, opened again, offers the decision.
        browser.driver.get(base + tom_link)
        seen["still_pending"] = bool(browser.driver.find_elements(By.ID, "approve"))
        if seen["still_pending"]:  # (else the assertions below say why)
            # A reviewer who is not tom approves it from the list.
            browser.login("carol")
            browser.open_call(toms, "e1")
            seen["approved"] = browser.decide("approve", "fine by me")
        return seen
    finally:
        browser.driver.quit()


@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="Debian's chromium and chromium-driver are not installed "
                           "(.ci/run installs them)")
async def test_TOM_is_not_offered_toms_call_and_is_refused_on_its_page(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ТОМ` (Cyrillic capitals) logs in to the inbox: the list leaves out
    tom's call (the reviewer's own calls, by the identity rule) but offers
    dave's, which ТОМ rejects; tom's call's page, opened directly, refuses
    ТОМ's approval with the reason, the refusal is audited
    (APPROVAL_REFUSED), the call stays pending; carol approves it and tom's
    turn completes."""
    import json

    from tests.test_decision_doors import audit, audited

    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    fake_llm.script(
        tool_reply(("e1", "createEmailTask", {"to": "ops@example.com", "subject": "Renewal",
                                              "body": "Please renew."})),
        tool_reply(("e1", "createEmailTask", {"to": "ops@example.com", "subject": "Lunch",
                                              "body": "Lunch on Friday?"})),
        text_reply("done"), text_reply("done"))
    port = free_port()
    database_url = f"sqlite:///{tmp_path}/t.db"
    settings = Settings.from_env({"TEMPORAL_ADDRESS": temporal_server.address,
                                  "TURNSTILE_TASK_QUEUE": task_queue,
                                  "DATABASE_URL": database_url})
    inbox = server(build_app(settings), "127.0.0.1", port, log_level="warning")
    serving = threading.Thread(target=inbox.run, daemon=True)
    async with running_worker(client, task_queue, database_url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        toms = await turns.start("remind ops about the renewal", user="tom",
                                 service="sales-assistant")
        await wait_pending(toms)
        daves = await turns.start("ask ops to lunch", user="dave", conversation="c-2",
                                 service="sales-assistant")
        await wait_pending(daves)
        serving.start()
        try:
            seen = await asyncio.to_thread(_tom_tries, f"http://127.0.0.1:{port}",
                                           toms.id, daves.id)
        finally:
            inbox.should_exit = True
            await asyncio.to_thread(serving.join, 10)
        await audited(turns.rt.db, toms, 1)  # the refusal's row, once written
        tom_result, dave_result = await toms.result(), await daves.result()
        refusals = audit(turns.rt.db, toms.id, "APPROVAL_REFUSED")
        decisions = {(d.workflow_id, d.reviewer) for d in records.recent_decisions(turns.rt.db)
                     if d.workflow_id in (toms.id, daves.id)}
    tom_link, dave_link = call_url(toms.id, "e1"), call_url(daves.id, "e1")
    assert seen["carol_lists"] == {tom_link: True, dave_link: True}
    assert seen["reviewer"] == TOM
    assert seen["tom_lists"] == {dave_link: True, tom_link: False}, seen
    assert "createEmailTask rejected by " + TOM in seen["rejected"], seen
    assert not any(n.endswith(tom_link) for n in seen["next"]), seen  # nor offered as next
    assert "createEmailTask for tom" in seen["requester"], seen
    refused = seen["refused"]
    assert "Refused" in refused and "confusable with the requester 'tom'" in refused, refused
    assert seen["still_pending"]
    assert "createEmailTask approved by carol" in seen.get("approved", ""), seen
    assert tom_result.status == TurnStatus.COMPLETED, tom_result.error
    [call] = tom_result.tool_calls
    assert call.status.value == "completed"
    assert dave_result.status == TurnStatus.COMPLETED, dave_result.error
    assert [c.status.value for c in dave_result.tool_calls] == ["rejected"]
    # One refusal, audited: ТОМ's try through the inbox (the client's update).
    [row] = refusals
    assert row["tool_name"] == "createEmailTask"
    assert "is confusable with the requester 'tom'" in row["error_message"], row
    assert json.loads(row["input_params"])["door"] == "update review"
    assert decisions == {(toms.id, "carol"), (daves.id, TOM)}


# -- a function model reads the tool's own dict after an edit made in the browser ------

def _edit_member(base: str, workflow_id: str, call_id: str) -> dict[str, Any]:
    browser = Browser(base, None)
    seen: dict[str, Any] = {}
    try:
        browser.login("carol")
        browser.open_call(workflow_id, call_id)
        field = browser.wait_for("edit-member_id")  # a review field, edited in place
        seen["shown"] = field.get_attribute("value")
        field.clear()
        field.send_keys("M-3")
        seen["approved"] = browser.decide("approve", "M-3 holds the card")
        seen["edited"] = browser.text("edited")
        return seen
    finally:
        browser.driver.quit()


@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="Debian's chromium and chromium-driver are not installed "
                           "(.ci/run installs them)")
async def test_a_function_model_reads_the_tools_dict_after_an_edit_in_the_browser(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A loans desk whose model is a Python function: it lends B-7 to M-2;
    carol changes member_id to M-3 on the call's page and approves; the
    function then reads the tool's own result as a dict (the loan as it was
    made, to M-3) with the edit beside it, and says so; the turn completes
    and the loan row is M-3's."""
    from tests.test_approval_edits import desk, loan_rows, prepared
    from turnstile.testing import FunctionModel, ModelCall, Reply, ToolOutcome, call

    read: list[ToolOutcome] = []

    def librarian(request: ModelCall) -> Reply:
        done = request.result_of("lendBook")
        if done is None:
            return call("lendBook", member_id="M-2", book_id="B-7")
        read.append(done)
        loan = done.result
        assert isinstance(loan, dict) and loan["member_id"] == "M-3", loan
        assert done.edits is not None, "the edit is not beside the result"
        change = done.edits.changes["member_id"]
        return (f"Lent {loan['book_id']} to {loan['member_id']} ({loan['status']}); "
                f"{done.edits.reviewer} changed member_id from {change.before} "
                f"to {change.after}")

    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    port = free_port()
    db = prepared(f"sqlite:///{tmp_path}/t.db")
    settings = Settings.from_env({"TEMPORAL_ADDRESS": temporal_server.address,
                                  "TURNSTILE_TASK_QUEUE": task_queue,
                                  "DATABASE_URL": db.url})
    inbox = server(build_app(settings), "127.0.0.1", port, log_level="warning")
    serving = threading.Thread(target=inbox.run, daemon=True)
    async with running_worker(client, task_queue, db.url, [desk()],
                              provider=FunctionModel(librarian)) as turns:
        handle = await turns.start("lend B-7 to M-2", service="loans", user="alice")
        [pending] = await wait_pending(handle)
        serving.start()
        try:
            seen = await asyncio.to_thread(_edit_member, f"http://127.0.0.1:{port}",
                                           handle.id, pending.tool_call_id)
        finally:
            inbox.should_exit = True
            await asyncio.to_thread(serving.join, 10)
        result = await handle.result()
    assert seen["shown"] == "M-2", seen  # what the model asked for
    assert "lendBook approved by carol" in seen["approved"], seen
    assert "member_id" in seen["edited"], seen
    assert result.status == TurnStatus.COMPLETED, result.error
    # The function read the tool's own dict, the edit beside it: reviewer, before, after.
    assert read, "the function never read the tool's result"
    outcome = read[-1]
    assert outcome.result == {"member_id": "M-3", "book_id": "B-7", "status": "OUT"}
    assert outcome.edits is not None and outcome.edits.reviewer == "carol"
    assert list(outcome.edits.changes) == ["member_id"]
    assert (outcome.edits.changes["member_id"].before,
            outcome.edits.changes["member_id"].after) == ("M-2", "M-3")
    assert result.answer == "Lent B-7 to M-3 (OUT); carol changed member_id from M-2 to M-3"
    [ran] = result.tool_calls
    assert ran.status.value == "completed" and not ran.rolled_back
    assert loan_rows(db) == [("M-3", "B-7", "OUT")]  # the edited effect
