"""An operator's rollout from the previous release to this one, and its
rollback, by the README's steps ("Upgrading"), with turns in flight on both.

The previous release is RELEASES.md's (tests/support/releases.py), run from its
recorded commit as its own `worker.py`, with the default build id its own
install has. It parks a turn on an approval (A) and another in the middle of a
model call (B). This release's worker starts beside it with its own default
build id — "runs beside", migrating the database on start — and is made
current with the Temporal CLI; a new turn (C) parks on it. Then the previous
release's worker is SIGKILLed and restarted, as a node restart would: a
release with the schema compatibility window (0.4.0 onward) starts on the
newer schema ("runs on a newer schema (REVISION)") and serves its pinned
turns; a release before it cannot start (`Can't locate revision`, the
documented limit) until `python -m turnstile.db stubs` hands it stubs of the
newer revisions, the documented remedy. B's model call, retried on the
restarted worker, answers. Rollback: the previous release is made current
again while A (on it) and C (on this release) are in flight; a new turn (D)
runs on the previous release, on the newer schema. Every turn is approved and
completes on the build that started it; one mail per approved e-mail;
`starter.py check` is clean.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.support.processes import wait_for
from tests.support.releases import (
    head_of,
    previous_release,
    release_tree,
    supports_schema_window,
    supports_worker_versioning,
)
from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import wait_pending
from tests.support.worker_process import ROOT, WorkerProcess
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    CallStatus,
    TurnInput,
    TurnResult,
    TurnStatus,
)
from turnstile.runtime.devstack import temporal_binary
from turnstile.runtime.versioning import current_build, default_build_id
from turnstile.stores.db import Database
from turnstile.stores.schema import current, head_revision
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

pytestmark = pytest.mark.live

Handle = WorkflowHandle[Any, TurnResult]


async def task_builds(handle: Handle) -> set[str]:
    """The builds of the workers that completed the turn's workflow tasks."""
    return {e.workflow_task_completed_event_attributes.deployment_version.build_id
            async for e in handle.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED}


def set_current(server: DevServer, deployment: str, build: str) -> None:
    """README step 2 (and the rollback), as the operator types it."""
    subprocess.run([temporal_binary(), "worker", "deployment", "set-current-version",
                    "--address", server.address, "--deployment-name", deployment,
                    "--build-id", build, "--yes"], check=True, capture_output=True, timeout=60)


def logged(log: Path, pattern: str, after: int = 0) -> re.Match[str] | None:
    return re.search(pattern, log.read_text()[after:])


async def test_rollout_restart_and_rollback_with_turns_in_flight(
        client: Client, temporal_server: DevServer, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    release = previous_release()
    old_tree = release_tree(release, tmp_path / "previous")
    if not supports_worker_versioning(old_tree):
        pytest.skip(f"the previous release {release.version} predates Worker Versioning")
    url = f"sqlite:///{tmp_path}/t.db"
    queue, name = f"ro-{uuid.uuid4().hex[:8]}", f"turnstile-{uuid.uuid4().hex[:8]}"
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": queue,
           "DATABASE_URL": url, "LLM_BASE_URL": fake_llm.url,
           "TURNSTILE_DATA_DIR": str(tmp_path / "data"), "TURNSTILE_WORKER_VERSIONING": "on",
           "TURNSTILE_DEPLOYMENT_NAME": name}
    subject = f"Rollout {uuid.uuid4().hex[:8]}"
    entered, held = threading.Event(), threading.Event()

    def model(request: dict[str, Any]) -> dict[str, Any]:
        last = request["messages"][-1]
        said = str(last.get("content") or "")
        if last["role"] == "tool":
            return text_reply("queued")
        if "think" in said:  # B: the model call is in flight until the test lets it go
            entered.set()
            held.wait(90)
            return text_reply("thought")
        if (turn := re.match(r"mail ops about (\w)", said)) is not None:
            return tool_reply((f"e-{uuid.uuid4().hex[:6]}", "createEmailTask",
                               {"to": "ops@example.com", "subject": subject,
                                "body": f"turn {turn.group(1)}"}))
        return text_reply("hello")

    fake_llm.default = model
    fake_llm.null_content_refused = False  # 0.2 sent null beside tool calls

    async def start(message: str) -> Handle:
        return await client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id=f"c-{uuid.uuid4().hex[:6]}",
                                     user_id="alice", message=message,
                                     service="sales-assistant"),
            id=f"ro-{uuid.uuid4().hex[:8]}", task_queue=queue, result_type=TurnResult)

    old_log, new_log = tmp_path / "previous.log", tmp_path / "new.log"
    old = WorkerProcess(old_log, env, root=old_tree).start()
    workers = [old]
    try:
        # The previous release: the deployment's first version, current at once.
        wait_for(lambda: logged(old_log, rf"version {name}:\S+ made current") is not None,
                 30, "the previous release current")
        found = logged(old_log, rf"version {name}:(\S+) made current")
        assert found is not None
        old_build = found.group(1)
        a = await start("mail ops about A")
        b = await start("think about B")
        [pending_a] = await wait_pending(a)
        assert await asyncio.to_thread(entered.wait, 30)

        # README step 1: this release's workers start beside it, build ids apart.
        new_build = default_build_id()
        assert new_build != old_build
        new = WorkerProcess(new_log, env).start()
        workers.append(new)
        wait_for(lambda: logged(new_log, f"version {name}:{re.escape(new_build)} runs beside "
                                         f"current build {re.escape(old_build)}") is not None,
                 30, "this release runs beside")
        assert current(Database(url)) == head_revision()  # it migrated on start
        # Step 2: it is made current; new turns go to it.
        set_current(temporal_server, name, new_build)
        assert await current_build(client, name) == new_build
        c = await start("mail ops about C")
        [pending_c] = await wait_pending(c)

        # A node restart of the previous release, its turns pinned to it.
        old.kill()
        offset = len(old_log.read_text())
        if not supports_schema_window(old_tree):
            # Before the window (0.3.0 and older) it cannot start on the newer
            # schema: its migrator does not know the revision (docs/operating.md) ...
            with pytest.raises(RuntimeError, match="worker exited"):
                WorkerProcess(old_log, env, root=old_tree).start()
            assert f"Can't locate revision identified by '{head_revision()}'" in \
                old_log.read_text()[offset:]
            # ... until it is handed stubs of the newer revisions (all compatible):
            # then it finds the database at its own head and migrates nothing.
            stubs = subprocess.run(
                [sys.executable, "-m", "turnstile.db", "stubs",
                 str(old_tree / "turnstile" / "migrations" / "versions")],
                cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert stubs.returncode == 0 and head_revision() in stubs.stdout, stubs.stderr
            offset = len(old_log.read_text())
        old = WorkerProcess(old_log, env, root=old_tree).start()
        workers.append(old)
        if supports_schema_window(old_tree) and head_of(old_tree) != head_revision():
            assert logged(old_log, re.escape(f"runs on a newer schema ({head_revision()})"),
                          offset), "the restarted previous release names the newer schema"
        assert current(Database(url)) == head_revision()
        held.set()  # B's model call answers (on the restarted worker: its retry)
        done_b = await asyncio.wait_for(b.result(), 90)
        assert done_b.status == TurnStatus.COMPLETED and done_b.answer == "thought", done_b.error

        # Rollback: the previous release current again, A (on it) and C (on
        # this release) in flight; a new turn runs on it, on the newer schema.
        set_current(temporal_server, name, old_build)
        assert await current_build(client, name) == old_build
        d = await start("mail ops about D")
        [pending_d] = await wait_pending(d)
        for handle, pending in ((a, pending_a), (c, pending_c), (d, pending_d)):
            await handle.signal("approve", ApproveSignal(tool_call_id=pending.tool_call_id,
                                                         reviewer="carol"))
        results = {h.id: await asyncio.wait_for(h.result(), 60) for h in (a, c, d)}
        for result in results.values():
            assert result.status == TurnStatus.COMPLETED, result.error
            assert [t.status for t in result.tool_calls] == [CallStatus.COMPLETED]
        # Every turn completed on the build that started it.
        assert {h.id: await task_builds(h) for h in (a, b, c, d)} == {
            a.id: {old_build}, b.id: {old_build}, c.id: {new_build}, d.id: {old_build}}
    finally:
        held.set()
        for worker in workers:
            worker.stop()
    with Database(url).connect() as conn:
        mails = fetchall(conn, "SELECT body, idempotency_key FROM email_task WHERE subject = :s",
                         {"s": subject})
    # One mail per approved e-mail, none twice.
    assert sorted(m["body"] for m in mails) == ["turn A", "turn C", "turn D"]
    assert len({m["idempotency_key"] for m in mails}) == 3
    checked = subprocess.run([sys.executable, "starter.py", "check"], cwd=ROOT,
                             env={"DATABASE_URL": url, "TEMPORAL_ADDRESS": temporal_server.address,
                                  "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
