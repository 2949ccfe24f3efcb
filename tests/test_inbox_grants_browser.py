"""Standing approvals in a real browser: Debian's Chromium, headless, driven by
Selenium, on the inbox served by uvicorn, against a real dev server and
worker (the sales service, a function model that mails the address the user
names). carol approves alice's mail to ops with a grant for 2 uses held to
its recipient (the subject left free); the next turn's mail to ops runs
without a reviewer; the /grants page lists the grant with one use taken;
carol revokes it there; the turn after waits for a reviewer again."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.support.processes import free_port
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker, wait_pending
from tests.test_grants import audit_grants, mailer
from tests.test_inbox_browser import CHROMIUM, DRIVER, Browser
from turnstile.engine.contract import TurnStatus
from turnstile.inbox.views import call_url
from turnstile.inbox.web_app import build_app, server
from turnstile.providers.function_model import FunctionModel
from turnstile.runtime.config import Settings
from turnstile.sales.service import build_sales_service
from turnstile.stores import grant_store
from turnstile.stores.db import Database


def _grant(base: str, workflow_id: str, call_id: str) -> dict[str, Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser = Browser(base, None)
    try:
        browser.login("carol")
        browser.driver.get(base + call_url(workflow_id, call_id))
        browser.wait_for("grant").click()
        Select(browser.wait_for("grant-scope")).select_by_value("user")
        browser.wait_for("grant-uses").send_keys("2")
        subject = browser.wait_for("grant-keep-subject")
        if subject.is_selected():  # held by default: let the subject vary
            subject.click()
        checked = {name: browser.wait_for(f"grant-keep-{name}").is_selected()
                   for name in ("to", "subject")}
        approved = browser.decide("approve", "ops mail is fine")
        issued = browser.text("issued-grant")
        browser.driver.find_element(By.ID, "grants-link").click()
        listed = str(browser.wait_for("grants").text)
        return {"approved": approved, "issued": issued, "listed": listed, "checked": checked}
    finally:
        browser.driver.quit()


def _revoke(base: str, grant_id: str) -> dict[str, Any]:
    from selenium.webdriver.common.by import By

    browser = Browser(base, None)
    try:
        browser.login("carol")
        browser.driver.get(f"{base}/grants")
        before = str(browser.wait_for(f"grant-{grant_id}").text)
        browser.wait_for(f"revoke-{grant_id}").click()
        outcome = str(browser.wait_for("outcome").text)
        live = str(browser.wait_for("grants").text)
        browser.driver.find_element(By.ID, "all-grants").click()
        every = str(browser.wait_for(f"grant-{grant_id}").text)
        return {"before": before, "outcome": outcome, "live": live, "every": every}
    finally:
        browser.driver.quit()


@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="Debian's chromium and chromium-driver are not installed "
                           "(.ci/run installs them)")
async def test_the_inbox_issues_lists_and_revokes_a_grant(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    port = free_port()
    database_url = f"sqlite:///{tmp_path}/t.db"
    settings = Settings.from_env({"TEMPORAL_ADDRESS": temporal_server.address,
                                  "TURNSTILE_TASK_QUEUE": task_queue,
                                  "DATABASE_URL": database_url})
    inbox = server(build_app(settings), "127.0.0.1", port, log_level="warning")
    serving = threading.Thread(target=inbox.run, daemon=True)
    base = f"http://127.0.0.1:{port}"
    async with running_worker(client, task_queue, database_url, [build_sales_service()],
                              provider=FunctionModel(mailer)) as turns:
        first = await turns.start("mail ops@example.com Q4 numbers", service="sales-assistant",
                                  conversation="c-1")
        [pending] = await wait_pending(first)
        serving.start()
        try:
            issued = await asyncio.to_thread(_grant, base, first.id, pending.tool_call_id)
            assert (await first.result()).status is TurnStatus.COMPLETED
            covered = await turns.run("mail ops@example.com Q1 plans", service="sales-assistant",
                                      conversation="c-2")
            [grant] = grant_store.listed(Database(database_url))
            revoked = await asyncio.to_thread(_revoke, base, grant.grant_id)
            after = await turns.start("mail ops@example.com Q2 plans",
                                      service="sales-assistant", conversation="c-3")
            [waiting] = await wait_pending(after)
            await after.cancel()
        finally:
            inbox.should_exit = True
            await asyncio.to_thread(serving.join, 10)
    assert "createEmailTask approved by carol" in issued["approved"]
    assert grant.grant_id in issued["issued"]
    assert issued["checked"] == {"to": True, "subject": False}
    assert grant.grant_id in issued["listed"] and "0/2" in issued["listed"]
    assert grant.scope_key == "alice" and set(grant.constraints) == {"to"}
    assert covered.status is TurnStatus.COMPLETED, covered.error
    assert "1/2" in revoked["before"] and "live" in revoked["before"]
    assert f"Grant {grant.grant_id} revoked by carol" in revoked["outcome"]
    assert grant.grant_id not in revoked["live"]
    assert "revoked by carol" in revoked["every"]
    assert waiting.grant_candidates == []
    rows = audit_grants(Database(database_url))
    assert [r["grant_id"] for r in rows if r["workflow_id"] == covered.workflow_id] == [
        grant.grant_id]
