"""`turnstile.client` through a real dev server and the strict fake model:
turns started and followed, pending approvals across turns, reviews with
typed refusals; and the README's example, run as printed."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.support.services import add, sendMoneySlowly
from tests.support.turns import running_worker, wait_pending
from turnstile.client import AlreadyDecided, ApprovalRefused, TurnNotFound, TurnstileClient
from turnstile.engine.contract import TurnInput, TurnStatus
from turnstile.runtime.config import Settings
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

ROOT = Path(__file__).resolve().parents[1]


def plain_service() -> Service:
    return Service(name="test", system_prompt="You are a test assistant.",
                   tools=ToolRegistry([add, sendMoneySlowly]))


def _client(client: Client, task_queue: str) -> TurnstileClient:
    return TurnstileClient(client, Settings.from_env({"TURNSTILE_TASK_QUEUE": task_queue}))


async def test_start_follow_review(client: Client, task_queue: str, tmp_path: Path,
                                   fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com",
                                                          "amount": 3})),
                    text_reply("paid"))
    tc = _client(client, task_queue)
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [plain_service()], llm_url=fake_llm.url):
        conversation = f"c-{uuid.uuid4().hex[:6]}"
        turn = await tc.start_turn(TurnInput(conversation_id=conversation, user_id="alice",
                                             message="pay bob", service="test"))
        await wait_pending(tc.temporal.get_workflow_handle(turn.id))
        pending: list[Any] = []
        for _ in range(100):  # visibility is eventually consistent
            pending = [p for p in await tc.pending_approvals(service="test")
                       if p.workflow_id == turn.id]
            if pending:
                break
            await asyncio.sleep(0.1)
        [view] = pending
        assert (view.tool_call_id, view.tool_name, view.requester, view.conversation_id) == (
            "p1", "sendMoneySlowly", "alice", conversation)
        assert view.arguments == {"to": "bob@example.com", "amount": 3}
        # The requester's own call is not in her inbox, and she may not decide it.
        assert turn.id not in {p.workflow_id for p in await tc.pending_approvals(
            reviewer="ALICE", service="test")}
        with pytest.raises(ApprovalRefused, match="requested this call"):
            await tc.review(turn.id, "p1", True, "Alice")
        decision = await tc.review(turn.id, "p1", True, "carol", "ok")
        assert (decision.approved, decision.reviewer, decision.tool_name) == (
            True, "carol", "sendMoneySlowly")
        with pytest.raises(AlreadyDecided):
            await tc.review(turn.id, "p1", False, "dave")
        steps = [e.step async for e in turn.events()]
        result = await turn.result()
    assert result.status == TurnStatus.COMPLETED and result.answer == "paid"
    assert "awaiting_approval" in steps and "approval" in steps and steps[-1] == "turn_completed"
    with pytest.raises(TurnNotFound):
        await tc.review(f"no-such-turn-{uuid.uuid4().hex[:6]}", "p1", True, "carol")


def test_the_readme_shows_the_example_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / "chat_backend.py").read_text()
    shown = re.search(r"<!-- example: examples/chat_backend.py -->\n```python\n(.*?)```",
                      readme, re.S)
    assert shown is not None, "README lost the client example"
    body = example.split('"""', 2)[2].lstrip("\n")  # the file without its docstring
    assert shown.group(1) == body


async def test_the_readme_example_runs(client: Client, task_queue: str, tmp_path: Path,
                                       fake_llm: FakeOpenAIServer) -> None:
    from examples.chat_backend import chat

    fake_llm.script(tool_reply(("a1", "add", {"a": 2, "b": 3})), text_reply("5"))
    tc = _client(client, task_queue)
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [plain_service()], llm_url=fake_llm.url):
        lines = [line async for line in chat(tc, f"c-{uuid.uuid4().hex[:6]}", "alice",
                                             "2+3?")]
    assert lines[-1] == "5"
    assert any(line.startswith("[model_call]") for line in lines)


async def test_pending_approvals_across_three_turns_of_two_services(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = lambda req: (text_reply("paid") if any(
        m["role"] == "tool" for m in req["messages"]) else tool_reply(
        ("p1", "sendMoneySlowly", {"to": "bob@example.com", "amount": 1})))
    ops = Service(name="ops", system_prompt="You run payments.",
                  tools=ToolRegistry([sendMoneySlowly]))
    tc = _client(client, task_queue)
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [plain_service(), ops], llm_url=fake_llm.url):
        started = {}
        for user, service in (("alice", "test"), ("bob", "test"), ("carol", "ops")):
            turn = await tc.start_turn(TurnInput(conversation_id=f"c-{uuid.uuid4().hex[:6]}",
                                                 user_id=user, message="pay",
                                                 service=service))
            await wait_pending(tc.temporal.get_workflow_handle(turn.id))
            started[user] = turn.id
        mine = set(started.values())
        listed: list[Any] = []
        for _ in range(100):  # visibility is eventually consistent
            listed = [p for p in await tc.pending_approvals() if p.workflow_id in mine]
            if len(listed) == 3:
                break
            await asyncio.sleep(0.1)
        assert {(p.requester, p.service) for p in listed} == {
            ("alice", "test"), ("bob", "test"), ("carol", "ops")}
        assert [p.requester for p in await tc.pending_approvals(service="ops")
                if p.workflow_id in mine] == ["carol"]
        for_bob = {p.requester for p in await tc.pending_approvals(reviewer="Bob")
                   if p.workflow_id in mine}
        assert for_bob == {"alice", "carol"}
        for user, wf in started.items():
            await tc.review(wf, "p1", True, "dave" if user != "dave" else "erin")
        results = [await tc.turn(wf).result() for wf in started.values()]
    assert [r.status for r in results] == [TurnStatus.COMPLETED] * 3


async def test_events_resume_across_a_worker_restart(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """A backend follows a turn's events, its worker goes away mid-turn and
    another takes over: the events resume from the offset already read, none
    repeated, none lost, to the end."""
    fake_llm.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob@example.com",
                                                          "amount": 2})),
                    text_reply("paid"))
    tc = _client(client, task_queue)
    url = f"sqlite:///{tmp_path}/t.db"
    seen: list[str] = []
    async with running_worker(client, task_queue, url, [plain_service()],
                              llm_url=fake_llm.url):
        turn = await tc.start_turn(TurnInput(conversation_id=f"c-{uuid.uuid4().hex[:6]}",
                                             user_id="alice", message="pay bob",
                                             service="test"))
        async for event in turn.events():
            seen.append(event.step)
            if event.step == "awaiting_approval":
                break
    # The worker is gone; the turn waits. Another worker comes, a reviewer decides.
    async with running_worker(client, task_queue, url, [plain_service()],
                              llm_url=fake_llm.url):
        await tc.review(turn.id, "p1", True, "carol")
        rest = [e.step async for e in turn.events(offset=len(seen))]
        result = await turn.result()
        final = await tc.turn(turn.id).status()  # a query needs a worker
    assert result.status == TurnStatus.COMPLETED
    assert seen[-1] == "awaiting_approval" and rest[0] == "approval"
    assert rest[-1] == "turn_completed" and "awaiting_approval" not in rest
    assert [e.step for e in final.events] == seen + rest  # nothing repeated, nothing lost
