"""The repeat breaker compares calls by meaning: the finding's three
createEmailTask calls — to ops@example.com, to OPS@example.com, with subject
"Follow up " — send one e-mail and ask one reviewer; the reviewer of a second
mail that looks like the first (same recipient) is shown the first; and
getEmailTaskStatus/retryEmailTask refuse a task another conversation made.
Real turns: the scripted model server over HTTP, a Temporal dev server,
SQLite and PostgreSQL, the sender delivering over SMTP to a local server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.support.databases import BACKENDS, worker_database_url
from tests.support.processes import free_port
from tests.support.turns import running_worker, wait_pending
from tests.test_repeat_breaker import approve_all, tool_messages
from turnstile.cli.printing import describe_pending
from turnstile.engine import attributes as attr
from turnstile.engine.contract import ApproveSignal, CallStatus, TurnStatus
from turnstile.runtime.config import Settings
from turnstile.sales.sender import SenderConfig, deliver_due
from turnstile.sales.service import build_sales_service
from turnstile.sales.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.sales.truth import disagreements
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MAIL = {"to": "ops@example.com", "subject": "Follow up", "body": "C0001 and C0002"}
REWORDED = [MAIL, {**MAIL, "to": "OPS@example.com"}, {**MAIL, "subject": "Follow up "}]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("one_response", [False, True], ids=["one-by-one", "one-response"])
async def test_three_reworded_repeats_of_one_email_send_one_mail(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        one_response: bool, request: pytest.FixtureRequest) -> None:
    if one_response and backend != "sqlite":
        pytest.skip("the one-response form runs on SQLite")
    url = worker_database_url(backend, request, tmp_path)
    calls = [(f"e{i + 1}", "createEmailTask", args) for i, args in enumerate(REWORDED)]
    if one_response:
        fake_llm.script(tool_reply(*calls), text_reply("Queued the e-mail to ops@example.com."))
    else:
        fake_llm.script(*(tool_reply(c) for c in calls),
                        text_reply("Queued the e-mail to ops@example.com."))
    port = free_port()
    env = {"SMTP_PORT": str(port), "SMTP_HOST": "127.0.0.1"}
    approved: list[str] = []
    with LocalSmtpServer(tmp_path / "mail", port=port):
        async with running_worker(client, task_queue, url, [build_sales_service()],
                                  llm_url=fake_llm.url, env=env) as turns:
            handle = await turns.start("mail ops", service="sales-assistant",
                                       conversation="c-meaning")
            await approve_all(handle, approved)
            result = await handle.result()
            db = Database(url)
            sent = deliver_due(db, Settings.from_env({"DATABASE_URL": url, **env}),
                               SenderConfig())
        mails = read_mailbox(tmp_path / "mail")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [(c.id, c.status, c.is_error) for c in result.tool_calls] == [
        ("e1", CallStatus.COMPLETED, False), ("e2", CallStatus.REPEATED, False),
        ("e3", CallStatus.REPEATED, False)]
    assert approved == ["e1"]  # the rewordings never reached a reviewer
    assert sent == 1 and len(mails) == 1  # one e-mail, delivered once
    told = tool_messages(fake_llm.requests[-1])
    assert [m["tool_call_id"] for m in told] == ["e1", "e2", "e3"]
    for message in told[1:]:
        assert message["content"].startswith(
            "Not run again: createEmailTask already ran in this turn with arguments that "
            "mean the same (call e1;")
        assert "mail-" in message["content"]
    memory = MemoryStore(db).messages("c-meaning")
    assert [m.attributes.get(attr.REPEAT_OF) for m in memory if m.role == "tool"] == [
        None, "e1", "e1"]
    assert [r.status for r in AuditLog(db).rows(handle.id)] == [
        "COMPLETED", "REPEATED", "REPEATED"]
    assert disagreements(db) == []  # the truth check agrees with memory and the outbox


async def approve(handle: Any, call_id: str) -> None:
    await handle.signal("approve", ApproveSignal(tool_call_id=call_id, reviewer="ops-lead"))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_reviewer_of_a_second_similar_mail_sees_the_first(
        client: Client, temporal_server: Any, task_queue: str, tmp_path: Path,
        fake_llm: FakeOpenAIServer, backend: str, request: pytest.FixtureRequest) -> None:
    """A second mail to the same recipient (another subject: another effect,
    so it is reviewed) carries the first in `similar_effects`, masked; in the
    conversation's next turn a third carries both, from an earlier turn. A
    mail to someone else shows none."""
    url = worker_database_url(backend, request, tmp_path)
    again = {**MAIL, "to": "OPS@Example.com", "subject": "Follow up, second try"}
    third = {**MAIL, "subject": "Third"}
    other = {**MAIL, "to": "finance@example.com", "subject": "Invoice"}
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)),
                    tool_reply(("e2", "createEmailTask", again)),
                    text_reply("Two e-mails queued."),
                    tool_reply(("e3", "createEmailTask", third)),
                    tool_reply(("e4", "createEmailTask", other)),
                    text_reply("Two more queued."))
    async with running_worker(client, task_queue, url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        first = await turns.start("mail ops", service="sales-assistant", conversation="c-alike")
        [p1] = await wait_pending(first)
        assert (p1.tool_call_id, p1.similar_effects) == ("e1", [])  # nothing went before
        await approve(first, "e1")
        p2 = await next_pending(first, "e2")
        page = await inbox_call_page(temporal_server.address, task_queue, url, first.id, "e2")
        await approve(first, "e2")
        assert (await first.result()).status == TurnStatus.COMPLETED

        second = await turns.start("mail ops again", service="sales-assistant",
                                   conversation="c-alike")
        p3 = await next_pending(second, "e3")
        await approve(second, "e3")
        p4 = await next_pending(second, "e4")
        await approve(second, "e4")
        assert (await second.result()).status == TurnStatus.COMPLETED
    [seen] = p2.similar_effects
    assert (seen.tool_name, seen.tool_call_id, seen.status, seen.this_turn, seen.same_effect) == (
        "createEmailTask", "e1", "completed", True, False)
    assert seen.at and seen.arguments["subject"] == "Follow up"
    assert "ops@example.com" not in json.dumps(seen.arguments)  # masked
    assert seen.arguments["to"].endswith("@example.com")
    assert [(s.tool_call_id, s.this_turn) for s in p3.similar_effects] == [
        ("e2", False), ("e1", False)]  # newest first, from the earlier turn
    assert p4.similar_effects == []  # another recipient and subject: nothing alike
    # The inbox's reviewer sees the first mail on the second's page, masked.
    assert "Earlier calls that look alike (1)" in page and "createEmailTask e1" in page, page
    assert "this turn" in page and "ops@example.com" not in page
    shown = "\n".join(describe_pending(p2))
    assert "1 earlier call(s) of createEmailTask look alike" in shown and "'e1'" in shown


async def inbox_call_page(address: str, queue: str, url: str, workflow_id: str,
                          call_id: str) -> str:
    """A call's page in the inbox (development login as carol), as a browser gets it."""
    from tests.test_inbox import _get, inbox_client, login
    from turnstile.inbox.views import call_url
    from turnstile.inbox.web_app import build_app

    settings = Settings.from_env({"TEMPORAL_ADDRESS": address, "TURNSTILE_TASK_QUEUE": queue,
                                  "DATABASE_URL": url})
    with inbox_client(build_app(settings, secret="s" * 32)) as tc:
        await login(tc, "carol")
        answer = await _get(tc, call_url(workflow_id, call_id))
        assert answer.status_code == 200, answer.text
        return str(answer.text)


def test_look_alikes_are_bounded() -> None:
    """What history keeps of a look-alike's arguments: texts cut, lists and
    depth bounded (an e-mail body is for the reviewer to open)."""
    from turnstile.activities.review import VALUE_CHARS, bounded

    shown = bounded({"body": "x" * 20_000, "cc": ["a"] * 50, "deep": {"a": {"b": {"c": {}}}}})
    assert len(shown["body"]) == VALUE_CHARS and shown["body"].endswith("…")
    assert len(shown["cc"]) == 20 and shown["deep"] == {"a": {"b": {"c": "…"}}}


async def next_pending(handle: Any, call_id: str) -> Any:
    """The pending call `call_id`, once it waits."""
    for _ in range(60):
        pending = await wait_pending(handle)
        found = [p for p in pending if p.tool_call_id == call_id]
        if found:
            return found[0]
    raise AssertionError(f"{call_id} never waited for a reviewer")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_task_ids_of_another_conversation_are_refused(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    """getEmailTaskStatus and retryEmailTask read by id: a task another
    conversation made is "no e-mail task" (an error result the model reads),
    the conversation's own is answered."""
    url = worker_database_url(backend, request, tmp_path)
    fake_llm.script(tool_reply(("e1", "createEmailTask", MAIL)), text_reply("Queued."))
    async with running_worker(client, task_queue, url, [build_sales_service()],
                              llm_url=fake_llm.url) as turns:
        mine = await turns.start("mail ops", service="sales-assistant", conversation="c-own")
        await wait_pending(mine)
        await approve(mine, "e1")
        assert (await mine.result()).status == TurnStatus.COMPLETED
        created = next(m for m in MemoryStore(turns.rt.db).messages("c-own")
                       if m.tool_call_id == "e1")
        task_id = json.loads(created.content or "{}")["taskId"]

        fake_llm.script(tool_reply(("s1", "getEmailTaskStatus", {"taskId": task_id}),
                                   ("r1", "retryEmailTask", {"taskId": task_id})),
                        text_reply("I cannot see that task."))
        theirs = await turns.start("status of that mail?", service="sales-assistant",
                                   conversation="c-other")
        refused = await theirs.result()

        fake_llm.script(tool_reply(("s2", "getEmailTaskStatus", {"taskId": task_id})),
                        text_reply("It is queued."))
        own = await turns.start("status?", service="sales-assistant", conversation="c-own")
        answered = await own.result()
    assert [(c.name, c.status, c.is_error) for c in refused.tool_calls] == [
        ("getEmailTaskStatus", CallStatus.INVALID_ARGUMENTS, True),
        ("retryEmailTask", CallStatus.INVALID_ARGUMENTS, True)]
    texts = [m["content"] for m in tool_messages(fake_llm.requests[-3])]
    assert texts == [f"no e-mail task {task_id} in this conversation; use the taskId that "
                     "createEmailTask returned"] * 2
    assert [(c.name, c.status, c.is_error) for c in answered.tool_calls] == [
        ("getEmailTaskStatus", CallStatus.COMPLETED, False)]
    assert '"status":"QUEUED"' in tool_messages(fake_llm.requests[-1])[-1]["content"]
