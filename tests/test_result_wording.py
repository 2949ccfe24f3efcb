"""Tool results that say what is done: every text a reference
tool's call returns to the model — results and errors alike — names only
tools its service offers. "Check delivery with getEmailTaskStatus" in a
service without that tool made a small model queue the same e-mail again and
again. Checked for every registered reference service and for a two-tool
service (the query tool and createEmailTask), with the tools run for real on
SQLite, and through a real turn of each kind of service."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from temporalio.client import Client

from examples.support_desk.app import build_app as build_desk_app
from examples.support_desk.tables import DEMO_ORDERS, desk_order
from tests.support.turns import running_worker
from tests.test_repeat_breaker import approve_all
from turnstile.engine.errors import ToolArgumentError
from turnstile.runtime.apps import tables_by_app
from turnstile.runtime.services import Service
from turnstile.runtime.tools import (
    Tool,
    ToolContext,
    ToolExecutionError,
    ToolRegistry,
    result_to_text,
)
from turnstile.sales import outbox
from turnstile.sales.app import build_sales_app
from turnstile.sales.outbox import EmailStatus
from turnstile.sales.sales_tools import createEmailTask, querySalesData
from turnstile.sales.schema import utc_text
from turnstile.sales.service import DEFAULT_OUTBOUND
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.stores.schema import upgrade
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

DESK = build_desk_app()
SALES = build_sales_app()


def two_tool_service() -> Service:
    """The compact shape a small model does best with: the query and the e-mail."""
    return Service(name="sales-two-tools", tools=ToolRegistry([querySalesData, createEmailTask]),
                   system_prompt="Find the customers, then e-mail ops.",
                   outbound=DEFAULT_OUTBOUND)


SERVICES = [*SALES.services, *DESK.services, two_tool_service()]
# Every tool name of every reference service, and any name shaped like one
# (a verb run into a capitalised noun): what a result must not name unoffered.
KNOWN_TOOLS = {t.name for s in SERVICES for t in s.tools}
TOOL_SHAPED = re.compile(r"\b(?:get|create|query|check|retry|issue|lookup|send|list|update|"
                         r"delete|cancel|find|search)[A-Z][A-Za-z]*\b")


def tool_names_in(text: str) -> set[str]:
    words = set(re.findall(r"\b[A-Za-z]+\b", text))
    return (words & KNOWN_TOOLS) | set(TOOL_SHAPED.findall(text))


@pytest.fixture
def world(tmp_path: Path) -> Database:
    """Both apps' tables on SQLite, three customers with a sale yesterday, the desk's orders."""
    db = Database(f"sqlite:///{tmp_path}/world.db")
    upgrade(db, apps=tables_by_app([SALES, DESK]))
    when = utc_text(datetime.now(UTC) - timedelta(days=1))
    with db.connect() as conn:
        conn.executemany(
            "INSERT INTO sales_record VALUES (:id, :c, :name, :email, 70000, :when)",
            [{"id": i, "c": c, "name": f"Name {c}", "email": f"{c.lower()}@example.com",
              "when": when} for i, c in enumerate(["C0001", "C0002", "C0003"])])
        conn.sa.execute(sa.insert(desk_order), DEMO_ORDERS)
    return db


class Calls:
    """Runs a service's tools for real, as its turns would (the context knows
    the tools the service offers), and keeps every text the model would read."""

    def __init__(self, db: Database, service: Service) -> None:
        self.db, self.service, self.n = db, service, 0
        self.texts: list[tuple[str, str]] = []

    def ctx(self, call_id: str | None = None) -> ToolContext:
        self.n += 1
        return ToolContext(db=self.db, workflow_id=f"wf-{self.service.name}",
                           conversation_id="c", user_id="u",
                           tool_call_id=call_id or f"call-{self.n}",
                           offered_tools=frozenset(self.service.tools.names()))

    async def __call__(self, name: str, ctx: ToolContext | None = None, **arguments: Any) -> Any:
        tool: Tool | None = self.service.tools.get(name)
        if tool is None:
            return None
        try:
            result = await tool.invoke(ctx or self.ctx(),
                                       tool.parse_arguments(json.dumps(arguments)))
        except (ToolArgumentError, ToolExecutionError) as exc:
            self.texts.append((name, str(exc)))
            return None
        self.texts.append((name, result_to_text(result)))
        return result


def set_status(db: Database, task_id: str, status: EmailStatus, possibly_sent: bool) -> None:
    with db.connect() as conn:
        conn.execute("UPDATE email_task SET status = :s, possibly_sent = :p, attempts = 1,"
                     " sent_at = '2026-01-01T10:00:00.000000Z' WHERE task_id = :t",
                     {"s": status, "p": possibly_sent, "t": task_id})


async def every_outcome(db: Database, service: Service) -> list[tuple[str, str]]:
    """Each tool of the service through its outcomes: data and none, done and
    done again, each e-mail status, each refusal."""
    call = Calls(db, service)
    today = datetime.now(UTC).date()
    await call("querySalesData", startDate=str(today - timedelta(days=7)),
               endDate=str(today), minAmount=1000)
    await call("querySalesData", startDate="2020-01-01", endDate="2020-01-31", minAmount=1)
    await call("createFollowUpTask", customerIds=["C0001", "C0002"], assignee="ops",
               note="call them")
    await call("createFollowUpTask", customerIds=["C9999"], assignee="ops", note="n")
    await call("checkEmailConfig")
    mail = {"to": "ops@example.com", "subject": "Follow up", "body": "C0001, C0002"}
    same = call.ctx()
    await call("createEmailTask", same, **mail)
    await call("createEmailTask", same, **mail)  # the same call again (a retry)
    task, _ = outbox.enqueue(db, idempotency_key=f"key-{service.name}", recipient="a@example.com",
                             subject="s", body="b")
    for status, possibly_sent in [(EmailStatus.QUEUED, False), (EmailStatus.SENDING, False),
                                  (EmailStatus.SENT, False), (EmailStatus.FAILED, True),
                                  (EmailStatus.DEAD, False), (EmailStatus.CANCELLED, False),
                                  (EmailStatus.FAILED, False)]:
        set_status(db, task.task_id, status, possibly_sent)
        await call("getEmailTaskStatus", taskId=task.task_id)
        await call("retryEmailTask", taskId=task.task_id)
    await call("getEmailTaskStatus", taskId="mail-" + "f" * 32)
    await call("retryEmailTask", taskId="mail-" + "f" * 32)
    await call("lookupOrder", order_id="A-1001")
    await call("lookupOrder", order_id="Z-9999")
    await call("issueRefund", order_id="A-1002", amount_cents=99_000)  # above the order
    await call("issueRefund", order_id="A-1001", amount_cents=2_500)
    await call("issueRefund", order_id="A-1001", amount_cents=2_500)  # refunded already
    await call("issueRefund", order_id="Z-9999", amount_cents=20_000)
    return call.texts


@pytest.mark.parametrize("service", [pytest.param(s, id=s.name) for s in SERVICES])
async def test_results_name_only_offered_tools(world: Database, service: Service) -> None:
    texts = await every_outcome(world, service)
    offered = set(service.tools.names())
    assert {name for name, _ in texts} == offered  # every tool of the service was run
    for tool, text in texts:
        named = tool_names_in(text)
        assert named <= offered, f"{tool} names {named - offered} in {service.name}: {text}"


async def test_the_email_result_names_a_next_step_only_when_offered(world: Database) -> None:
    """The same call in the full service and in the two-tool one: done, do not
    queue it again; a status check only where getEmailTaskStatus exists."""
    mail = {"to": "ops@example.com", "subject": "s", "body": "b"}
    full, compact = SALES.services[0], two_tool_service()
    [(_, in_full)] = (await _one(world, full, "createEmailTask", **mail))
    [(_, in_compact)] = (await _one(world, compact, "createEmailTask", **mail))
    for text in (in_full, in_compact):
        assert "Done: the e-mail is queued" in text and "Do not queue it again" in text
    assert "getEmailTaskStatus" in in_full and "getEmailTaskStatus" not in in_compact


async def _one(db: Database, service: Service, name: str, **arguments: Any
               ) -> list[tuple[str, str]]:
    call = Calls(db, service)
    await call(name, **arguments)
    return call.texts


async def test_a_turn_of_the_two_tool_service_is_told_only_its_tools(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """Through the product: the activity hands the tool its service's tools."""
    url = f"sqlite:///{tmp_path}/sales.db"
    upgrade(Database(url), apps=tables_by_app([SALES]))
    mail = {"to": "ops@example.com", "subject": "Follow up", "body": "C0001"}
    fake_llm.script(tool_reply(("e1", "createEmailTask", mail)), text_reply("Queued."))
    async with running_worker(client, task_queue, url, [two_tool_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-two-tools", conversation="c-2")
        await approve_all(handle, [])
        result = await handle.result()
        memory = MemoryStore(turns.rt.db).messages("c-2")
    assert result.status == "completed", result.error
    [told] = [m for m in memory if m.role == "tool"]
    assert "Done: the e-mail is queued" in (told.content or "")
    assert tool_names_in(told.content or "") <= {"querySalesData", "createEmailTask"}
