"""The compact reference service `sales-compact` (docs/sales.md): what its
requests carry (a short prompt, two tools in the grammar dialect, no
documents, its model settings) through a real turn against the scripted
server on SQLite and PostgreSQL, its e-mail call written as text and read as
a call (text_tool_calls), and that the offline demo planner runs its
scenario."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.client import Client

from tests.support.databases import BACKENDS, worker_database_url
from tests.support.turns import running_worker
from tests.test_sales_turns import DEMO, TODAY, approve_when_asked, email_tasks
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.sales.planner import demo_planner
from turnstile.sales.seed import last_week, seed
from turnstile.sales.service import COMPACT_SERVICE_NAME, build_compact_sales_service
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_compact_turn_sends_a_small_request(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    start, end = last_week(TODAY)
    fake_llm.script(
        tool_reply(("q1", "querySalesData", {"startDate": start.isoformat(),
                                             "endDate": end.isoformat(), "minAmount": 50000})),
        # The service reads calls written as text (text_tool_calls): the e-mail
        # written in <tools>, as Qwen2.5-Coder writes calls under llama-server.
        text_reply('<tools>\n{"name": "createEmailTask", "arguments": {"to": "ops@example.com",'
                   ' "subject": "Follow up", "body": "Customers above 50,000 last week."}}'
                   '\n</tools>'),
        text_reply("Queued the e-mail."))
    async with running_worker(client, task_queue, worker_database_url(backend, request, tmp_path),
                              [build_compact_sales_service()], llm_url=fake_llm.url) as turns:
        seed(turns.rt.db, rows=500, today=TODAY)
        handle = await turns.start(DEMO, service=COMPACT_SERVICE_NAME, conversation="c-compact")
        await approve_when_asked(handle, "ops-lead")
        result = await handle.result()
        tasks = email_tasks(turns.rt.db, handle.id)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [(c.name, c.status) for c in result.tool_calls] == [
        ("querySalesData", CallStatus.COMPLETED), ("createEmailTask", CallStatus.COMPLETED)]
    assert len(tasks) == 1 and fake_llm.refusals == []
    assert (tasks[0]["recipient"], tasks[0]["subject"]) == ("ops@example.com", "Follow up")
    first = fake_llm.requests[0]
    system, user = first["messages"][0], first["messages"][1]
    assert system["content"].startswith("You are a sales assistant. Today is")
    # ~430 bytes of prompt and ~260 of dates the model copies.
    assert len(system["content"].encode()) < 800
    assert user["content"] == DEMO  # no documents
    assert [t["function"]["name"] for t in first["tools"]] == ["querySalesData",
                                                                "createEmailTask"]
    body = first["tools"][1]["function"]["parameters"]["properties"]["body"]
    assert "maxLength" not in body  # 20000 in the tool: the grammar dialect leaves it out
    assert (first["max_tokens"], first["temperature"], first["tool_choice"]) == (1024, 0.2,
                                                                              "auto")
    # The reference request was 5.7 KB.
    assert first["_bytes"] < 3500, first["_bytes"]


async def test_the_offline_planner_runs_the_compact_scenario(client: Client, task_queue: str,
                                                             tmp_path: Path) -> None:
    today = datetime.now(UTC).date()
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [build_compact_sales_service()],
                              provider=demo_planner(today=lambda: today)) as turns:
        seed(turns.rt.db, rows=3000, today=today)
        handle = await turns.start(DEMO, service=COMPACT_SERVICE_NAME, conversation="c-off")
        [pending] = await approve_when_asked(handle, "ops-lead")
        result = await handle.result()
    assert pending.tool_name == "createEmailTask"
    assert result.status == TurnStatus.COMPLETED, result.error
    assert "createFollowUpTask" not in (result.answer or "")
