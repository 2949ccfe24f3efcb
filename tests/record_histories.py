"""Record the histories replayed by tests/test_replay.py.

    .venv/bin/python -m tests.record_histories [NAME ...]

Runs the main scenarios — the demo turn (offline planner, approval, e-mail
queued), an approval rejection, a compensation, a breaker trip, an answer
cut twice at the length limit (continuation, then `truncated`), an answer
withheld by the provider's content filter — on a fresh dev server and writes
each history to tests/histories/NAME.json (only the NAMEs given, if any). Commit the
files: replaying them on every run makes a workflow change that would break
turns in flight fail CI. Re-record only for a deliberate, versioned change
(turnstile.engine.versions: bump TURN_VERSION, keep the old files in
tests/histories/v<N>/ for tests/test_upgrade.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from collections.abc import Awaitable, Callable
from datetime import date
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from tests.support.fake_llm import FakeLLM, text_reply, tool_reply
from tests.support.processes import free_port
from tests.support.services import make_service
from tests.support.temporal_server import DevServer, connect
from tests.support.turns import Turns, running_worker
from turnstile.engine.contract import ApproveSignal, PendingApproval, RejectSignal
from turnstile.sales.planner import demo_planner
from turnstile.sales.seed import seed
from turnstile.sales.service import build_sales_service
from turnstile.stores.db import Database
from turnstile.stores.schema import ensure_schema

OUT = Path(__file__).parent / "histories"
DEMO = "Find customers whose sales last week exceeded 50,000 and email ops@example.com to follow up"
TODAY = date(2026, 11, 25)


async def approve_all(handle: WorkflowHandle, reviewer: str, approve: bool = True) -> None:
    done: set[str] = set()
    while True:
        try:
            await asyncio.wait_for(asyncio.shield(handle.result()), 0.1)
            return
        except TimeoutError:
            pass
        for p in await handle.query("pending_approvals", result_type=list[PendingApproval]):
            if p.tool_call_id in done:
                continue
            done.add(p.tool_call_id)
            signal: Any = (ApproveSignal(tool_call_id=p.tool_call_id, reviewer=reviewer)
                           if approve else RejectSignal(tool_call_id=p.tool_call_id,
                                                        reviewer=reviewer, reason="no"))
            await handle.signal("approve" if approve else "reject", signal)


async def save(name: str, handle: WorkflowHandle) -> None:
    await handle.result()
    history = await handle.fetch_history()
    (OUT / f"{name}.json").write_text(history.to_json())
    logging.info("recorded %s (%d events)", name, len(history.events))


def ended(text: str | None, reason: str) -> dict[str, Any]:
    reply = text_reply(text or "")
    reply["choices"][0]["finish_reason"] = reason
    reply["choices"][0]["message"]["content"] = text
    return reply


async def scenario(client: Client, fake: FakeLLM, tmp: Path, name: str,
                   services: list, provider: Any,  # type: ignore[type-arg]
                   body: Callable[[Turns], Awaitable[WorkflowHandle]]) -> None:
    if sys.argv[1:] and name not in sys.argv[1:]:
        return
    async with running_worker(client, f"rec-{name}", f"sqlite:///{tmp}/{name}.db", services,
                              provider=provider, llm_url=None if provider else fake.url) as turns:
        await save(name, await body(turns))


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    OUT.mkdir(exist_ok=True)
    server = DevServer(free_port(), Path(tempfile.mkdtemp()) / "server.log")
    fake = FakeLLM()
    try:
        client = await connect(server.address)
        tmp = Path(tempfile.mkdtemp())
        db = Database(f"sqlite:///{tmp}/demo.db")
        ensure_schema(db)
        seed(db, rows=2000, today=TODAY)

        async def demo(turns: Turns) -> WorkflowHandle:
            h = await turns.start(DEMO, service="sales-assistant", workflow_id="demo-turn",
                                  conversation="c-demo")
            await approve_all(h, "ops-lead")
            return h

        await scenario(client, fake, tmp, "demo", [build_sales_service()],
                       demo_planner(today=lambda: TODAY), demo)

        async def rejected(turns: Turns) -> WorkflowHandle:
            fake.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob", "amount": 3})),
                        text_reply("not paid"))
            h = await turns.start("pay bob", workflow_id="approval-rejected")
            await approve_all(h, "carol", approve=False)
            return h

        await scenario(client, fake, tmp, "approval_rejected", [make_service()], None, rejected)

        async def compensation(turns: Turns) -> WorkflowHandle:
            fake.script(tool_reply(("r1", "reserve", {"item": "table"})),
                        tool_reply(("r2", "reserve", {"item": "chairs"})),
                        tool_reply(("m1", "mustSucceed", {})))
            return await turns.start("book", workflow_id="compensation")

        await scenario(client, fake, tmp, "compensation", [make_service()], None, compensation)

        async def breaker(turns: Turns) -> WorkflowHandle:
            fake.default = lambda req: tool_reply((f"c{len(req['messages'])}", "add",
                                                   {"a": 1, "b": 1}))
            return await turns.start("busy", workflow_id="breaker-trip")

        await scenario(client, fake, tmp, "breaker_trip",
                       [make_service(breakers={"max_tool_executions": 3})], None, breaker)

        async def truncated(turns: Turns) -> WorkflowHandle:
            fake.script(ended("part one,", "length"), ended(" part two,", "length"))
            return await turns.start("tell it all", workflow_id="truncated")

        await scenario(client, fake, tmp, "truncated", [make_service()], None, truncated)

        async def filtered(turns: Turns) -> WorkflowHandle:
            fake.script(ended(None, "content_filter"))
            return await turns.start("something filtered", workflow_id="content-filtered")

        await scenario(client, fake, tmp, "content_filtered", [make_service()], None, filtered)
    finally:
        fake.close()
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
