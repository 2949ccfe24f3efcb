"""Upgrades with Worker Versioning, tried as an operator does them on one dev
server (docs/operating.md, "Upgrading"): release N parks a turn on an approval; release
N+1 starts and becomes current; new turns run on N+1; the old turn is
approved and completes on N, the build that started it; then N is stopped.
No turn fails, and each approved call leaves one mail."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.support.processes import free_port, wait_for
from tests.support.resets import reset_to, task_after
from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import wait_pending
from tests.support.worker_process import WorkerProcess
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    CallStatus,
    TurnInput,
    TurnResult,
    TurnStatus,
)
from turnstile.runtime.config import Settings
from turnstile.runtime.devstack import Stack
from turnstile.runtime.versioning import Deployment, current_build, pinned_running
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

pytestmark = pytest.mark.live

SUBJECT = f"Follow up {uuid.uuid4().hex[:8]}"  # this module's mails, in a shared database
MAIL = {"to": "ops@example.com", "subject": SUBJECT, "body": "C0001"}


async def pinned_build(handle: WorkflowHandle) -> str:  # type: ignore[type-arg]
    info = (await handle.describe()).raw_description.workflow_execution_info.versioning_info
    return info.deployment_version.build_id


async def task_builds(handle: WorkflowHandle) -> list[str]:  # type: ignore[type-arg]
    """The build of the worker that completed each workflow task of the turn."""
    return [e.workflow_task_completed_event_attributes.deployment_version.build_id
            async for e in handle.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]


async def eventually_zero(count: Callable[[], Awaitable[int]], timeout: float = 20) -> None:
    """Visibility is eventually consistent: wait until `count` reads 0."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (n := await count()) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.2)
    assert n == 0


def turn_input(conversation: str, message: str) -> TurnInput:
    return TurnInput(conversation_id=conversation, user_id="alice", message=message,
                     service="sales-assistant")

def rollout_env(server: DevServer, tmp_path: Path, url: str, llm_url: str) -> dict[str, str]:
    """The environment of a release's workers: a task queue and a deployment
    of their own, versioning on."""
    return {"TEMPORAL_ADDRESS": server.address,
            "TURNSTILE_TASK_QUEUE": f"wv-{uuid.uuid4().hex[:8]}", "DATABASE_URL": url,
            "LLM_BASE_URL": llm_url,
            "TURNSTILE_DATA_DIR": str(tmp_path / "data"), "TURNSTILE_WORKER_VERSIONING": "on",
            "TURNSTILE_DEPLOYMENT_NAME": f"turnstile-{uuid.uuid4().hex[:8]}"}


def mail_when_asked(subject: str) -> Callable[[dict], object]:  # type: ignore[type-arg]
    """The model: a message about mail gets a createEmailTask call, a tool
    result "queued", anything else "hello"."""
    def reply(request: dict) -> object:  # type: ignore[type-arg]
        if request["messages"][-1]["role"] == "tool":
            return text_reply("queued")
        if "mail" in request["messages"][-1]["content"]:
            return tool_reply((f"e-{uuid.uuid4().hex[:6]}", "createEmailTask",
                               {**MAIL, "subject": subject}))
        return text_reply("hello")

    return reply



@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_turn_in_flight_finishes_on_its_release_while_new_turns_go_to_the_next(
        backend: str, client: Client, temporal_server: DevServer, tmp_path: Path,
        fake_llm: FakeOpenAIServer, request: pytest.FixtureRequest) -> None:
    url = (request.getfixturevalue("postgres_url") if backend == "postgresql"
           else f"sqlite:///{tmp_path}/t.db")
    env = rollout_env(temporal_server, tmp_path, url, fake_llm.url)
    queue, name = env["TURNSTILE_TASK_QUEUE"], env["TURNSTILE_DEPLOYMENT_NAME"]
    old, new = Deployment(name, "release-n"), Deployment(name, "release-n1")
    fake_llm.default = mail_when_asked(SUBJECT)
    # Release N: the deployment's first version, current at once.
    n = WorkerProcess(tmp_path / "n.log", {**env, "TURNSTILE_BUILD_ID": old.build_id}).start()
    n1 = None
    try:
        wait_for(lambda: b"made current" in (tmp_path / "n.log").read_bytes(), 30, "N current")
        conversation = f"c-{uuid.uuid4().hex[:6]}"
        parked = await client.start_workflow(
            WORKFLOW_TYPE, turn_input(conversation, "mail ops"), id=f"wv-{uuid.uuid4().hex[:8]}",
            task_queue=queue, result_type=TurnResult)
        [pending] = await wait_pending(parked)
        assert await pinned_build(parked) == old.build_id
        assert await pinned_running(client, old) == 1

        # Release N+1 starts and becomes current, as `make up` does it.
        n1 = WorkerProcess(tmp_path / "n1.log", {**env, "TURNSTILE_BUILD_ID": new.build_id,
                                                "TURNSTILE_MAKE_CURRENT": "always"}).start()
        wait_for(lambda: b"made current (was release-n)" in (tmp_path / "n1.log").read_bytes(),
                 30, "N+1 current")
        assert await current_build(client, name) == new.build_id
        fresh = await client.start_workflow(
            WORKFLOW_TYPE, turn_input(f"c-{uuid.uuid4().hex[:6]}", "hi"),
            id=f"wv-{uuid.uuid4().hex[:8]}", task_queue=queue, result_type=TurnResult)
        done = await asyncio.wait_for(fresh.result(), 60)
        assert done.status == TurnStatus.COMPLETED, done.error
        assert set(await task_builds(fresh)) == {new.build_id}

        # The old turn is approved and completes on N, the build that started it.
        await parked.signal("approve", ApproveSignal(tool_call_id=pending.tool_call_id,
                                                     reviewer="carol"))
        result = await asyncio.wait_for(parked.result(), 60)
        assert result.status == TurnStatus.COMPLETED, result.error
        assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
        assert set(await task_builds(parked)) == {old.build_id}
        await eventually_zero(lambda: pinned_running(client, old))  # drained: N may stop
    finally:
        n.stop()
    # N is gone; the next turn (on the parked turn's conversation) runs on N+1.
    try:
        after = await client.execute_workflow(
            WORKFLOW_TYPE, turn_input(conversation, "and again"),
            id=f"wv-{uuid.uuid4().hex[:8]}", task_queue=queue, result_type=TurnResult)
        assert after.status == TurnStatus.COMPLETED, after.error
    finally:
        if n1 is not None:
            n1.stop()
    failed = await client.count_workflows(
        f"TaskQueue = '{queue}' AND ExecutionStatus != 'Completed'")
    assert failed.count == 0
    with Database(url).connect() as conn:
        mails = fetchall(conn, "SELECT recipient FROM email_task WHERE subject = :s",
                               {"s": SUBJECT})
    assert len(mails) == 1


async def test_a_worker_never_takes_current_from_another_version_unless_told(
        client: Client, temporal_server: DevServer, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    env = rollout_env(temporal_server, tmp_path, f"sqlite:///{tmp_path}/t.db", fake_llm.url)
    name = env["TURNSTILE_DEPLOYMENT_NAME"]
    first = WorkerProcess(tmp_path / "a.log", {**env, "TURNSTILE_BUILD_ID": "a"}).start()
    second = None
    try:
        wait_for(lambda: b"made current" in (tmp_path / "a.log").read_bytes(), 30, "a current")
        second = WorkerProcess(tmp_path / "b.log", {**env, "TURNSTILE_BUILD_ID": "b"}).start()
        wait_for(lambda: b"runs beside current build a" in (tmp_path / "b.log").read_bytes(),
                 30, "b's notice")
        assert await current_build(client, name) == "a"
        log = (tmp_path / "b.log").read_text()
        assert f"set-current-version --deployment-name {name} --build-id b" in log
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_make_up_after_an_upgrade_keeps_the_running_turn_going(
        client: Client, temporal_server: DevServer, tmp_path: Path, fake_llm: FakeOpenAIServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`make up` twice, the checkout changed in between (a new build id): the
    second starts the new build's worker and makes it current; the old one keeps
    its parked turn until it is approved and done; the next `make up` stops it."""
    queue = f"wv-{uuid.uuid4().hex[:8]}"
    name = f"turnstile-{uuid.uuid4().hex[:8]}"
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": queue,
           "DATABASE_URL": f"sqlite:///{tmp_path}/t.db", "LLM_BASE_URL": fake_llm.url,
           "TURNSTILE_DATA_DIR": str(tmp_path / "data"), "TURNSTILE_DEPLOYMENT_NAME": name,
           "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(free_port()),
           "TURNSTILE_WORKER_VERSIONING": "on"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    fake_llm.default = lambda request: (
        text_reply("queued") if any(m.get("role") == "tool" for m in request["messages"])
        else tool_reply((f"e-{uuid.uuid4().hex[:6]}", "createEmailTask", MAIL)))

    def stack(build: str) -> Stack:
        monkeypatch.setenv("TURNSTILE_BUILD_ID", build)
        return Stack(Settings.from_env())

    first = stack("checkout-1")
    try:
        await asyncio.to_thread(first.up)
        parked = await client.start_workflow(
            WORKFLOW_TYPE, turn_input(f"c-{uuid.uuid4().hex[:6]}", "mail ops"),
            id=f"wv-{uuid.uuid4().hex[:8]}", task_queue=queue, result_type=TurnResult)
        [pending] = await wait_pending(parked)
        second = stack("checkout-2")
        await asyncio.to_thread(second.up)
        assert second.workers() == ["worker-checkout-1", "worker-checkout-2"]
        assert await current_build(client, name) == "checkout-2"
        await parked.signal("approve", ApproveSignal(tool_call_id=pending.tool_call_id,
                                                     reviewer="carol"))
        result = await asyncio.wait_for(parked.result(), 60)
        assert result.status == TurnStatus.COMPLETED, result.error
        assert set(await task_builds(parked)) == {"checkout-1"}
        await eventually_zero(lambda: pinned_running(client, Deployment(name, "checkout-1")))
        await asyncio.to_thread(second.up)  # the drained build's worker stops
        assert second.workers() == ["worker-checkout-2"]
    finally:
        await asyncio.to_thread(first.down)  # the same pid files: every build's worker
    assert first.workers() == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_terminate_and_reset_in_the_middle_of_a_rollout(
        backend: str, client: Client, temporal_server: DevServer, tmp_path: Path,
        fake_llm: FakeOpenAIServer, request: pytest.FixtureRequest) -> None:
    """While N+1 becomes current, an operator terminates one turn parked on N
    and resets another to its model call. The terminated turn's conversation
    goes on under N+1 (its lock taken over, its call that never started told
    it did not run); the reset run stays pinned to N, asks for the approval
    again, is approved and mails once."""
    url = (request.getfixturevalue("postgres_url") if backend == "postgresql"
           else f"sqlite:///{tmp_path}/t.db")
    env = rollout_env(temporal_server, tmp_path, url, fake_llm.url)
    queue, name = env["TURNSTILE_TASK_QUEUE"], env["TURNSTILE_DEPLOYMENT_NAME"]
    old = Deployment(name, "release-n")
    subject = f"Reset {uuid.uuid4().hex[:8]}"
    fake_llm.default = mail_when_asked(subject)
    n = WorkerProcess(tmp_path / "n.log", {**env, "TURNSTILE_BUILD_ID": old.build_id}).start()
    n1 = None
    try:
        wait_for(lambda: b"made current" in (tmp_path / "n.log").read_bytes(), 30, "N current")
        doomed_conv, reset_conv = f"c-{uuid.uuid4().hex[:6]}", f"c-{uuid.uuid4().hex[:6]}"
        doomed = await client.start_workflow(
            WORKFLOW_TYPE, turn_input(doomed_conv, "mail ops"), id=f"wv-{uuid.uuid4().hex[:8]}",
            task_queue=queue, result_type=TurnResult)
        to_reset = await client.start_workflow(
            WORKFLOW_TYPE, turn_input(reset_conv, "mail ops"), id=f"wv-{uuid.uuid4().hex[:8]}",
            task_queue=queue, result_type=TurnResult)
        await wait_pending(doomed)
        await wait_pending(to_reset)

        n1 = WorkerProcess(tmp_path / "n1.log", {**env, "TURNSTILE_BUILD_ID": "release-n1",
                                                "TURNSTILE_MAKE_CURRENT": "always"}).start()
        wait_for(lambda: b"made current (was release-n)" in (tmp_path / "n1.log").read_bytes(),
                 30, "N+1 current")

        await doomed.terminate("operator: rolled out without it")
        after = await asyncio.wait_for(client.execute_workflow(
            WORKFLOW_TYPE, turn_input(doomed_conv, "and now?"), id=f"wv-{uuid.uuid4().hex[:8]}",
            task_queue=queue, result_type=TurnResult), 60)
        assert after.status == TurnStatus.COMPLETED, after.error

        first_run = to_reset.first_execution_run_id or ""
        point = await task_after(client, to_reset.id, first_run, "turnstile.call_model")
        rerun = await reset_to(client, to_reset.id, first_run, point)
        [again] = await wait_pending(rerun)
        await rerun.signal("approve", ApproveSignal(tool_call_id=again.tool_call_id,
                                                    reviewer="carol"))
        result = await asyncio.wait_for(rerun.result(), 60)
        assert result.status == TurnStatus.COMPLETED, result.error
        assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
        reset_builds = set(await task_builds(rerun))
    finally:
        n.stop()
        if n1 is not None:
            n1.stop()
    # A reset run stays pinned to the build of the run it replaces.
    assert reset_builds == {old.build_id}
    with Database(url).connect() as conn:
        mails = fetchall(conn, "SELECT recipient FROM email_task WHERE subject = :s",
                         {"s": subject})
        repaired = fetchall(conn, "SELECT content FROM chat_message WHERE conversation_id = :c "
                                  "AND role = 'tool'", {"c": doomed_conv})
    assert len(mails) == 1  # the terminated turn's call never ran; the reset one ran once
    assert len(repaired) == 1 and "did not run" in repaired[0]["content"]
