"""A reviewer in a real browser (Debian's Chromium, headless, through
Selenium) approves a call in the inbox served by uvicorn, against a real dev
server, worker and fake model; the turn completes with the decision."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from temporalio.client import Client

from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
from tests.support.processes import free_port
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker, wait_pending
from tests.test_client import plain_service
from turnstile.engine.contract import TurnStatus
from turnstile.inbox.app import build_app
from turnstile.runtime.config import Settings

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def _review_in_the_browser(base: str, workflow_id: str) -> str:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=DriverService(DRIVER or ""))
    try:
        driver.get(f"{base}/")
        driver.find_element(By.NAME, "name").send_keys("carol")
        driver.find_element(By.CSS_SELECTOR, "form button").click()
        link = f"/calls/{workflow_id}/p1"
        for _ in range(100):  # the list refreshes itself; visibility catches up
            found = driver.find_elements(By.CSS_SELECTOR, f'a[href="{link}"]')
            if found:
                found[0].click()
                break
            time.sleep(0.2)
            driver.get(f"{base}/")
        else:
            raise AssertionError("the pending call never appeared in the inbox")
        driver.find_element(By.NAME, "note").send_keys("fine by me")
        driver.find_element(By.ID, "approve").click()
        return str(driver.find_element(By.ID, "outcome").text)
    finally:
        driver.quit()


@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="Debian's chromium and chromium-driver are not installed "
                           "(.ci/run installs them)")
async def test_a_reviewer_approves_in_the_browser(
        client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
        fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTILE_INBOX_IDENTITY_HEADER", raising=False)
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com", "amount": 9})),
                    text_reply("paid"))
    port = free_port()
    settings = Settings.from_env({"TEMPORAL_ADDRESS": temporal_server.address,
                                  "TURNSTILE_TASK_QUEUE": task_queue})
    server = uvicorn.Server(uvicorn.Config(build_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [plain_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("pay bob", user="alice", service="test", variables={})
        await wait_pending(handle)
        serving.start()
        try:
            outcome = await asyncio.to_thread(_review_in_the_browser,
                                              f"http://127.0.0.1:{port}", handle.id)
        finally:
            server.should_exit = True
            await asyncio.to_thread(serving.join, 10)
        result = await handle.result()
    assert "sendMoneySlowly approved by carol" in outcome
    assert result.status == TurnStatus.COMPLETED
