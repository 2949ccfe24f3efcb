"""The upgrade path of turns in flight (docs/operating.md, "Upgrading"): a worker refuses
to start while turns of an older command-sequence version run, and says what
to do; histories of the older version are recognised as such, and indeed do
not replay on this version's code (which is why the worker refuses). A turn
begun at an earlier revision of this version finishes along that revision's
commands on today's worker."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import CancelledError
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from tests.support.processes import wait_for
from tests.support.services import make_service
from tests.support.temporal_server import DevServer
from tests.support.turns import Turns, local_activities
from tests.support.worker_env import WORKER_ENV
from tests.support.worker_process import WorkerProcess
from turnstile.activities import Runtime, all_activities
from turnstile.cli.worker import EXIT_OLDER_TURNS, build_worker
from turnstile.engine import activity_io as io
from turnstile.engine.activity_io import DESCRIBE_SERVICE
from turnstile.engine.contract import WORKFLOW_TYPE, TurnStatus
from turnstile.engine.versions import (
    CANCEL_ENDS_CANCELLED,
    FINDABLE_AT_START,
    OPENS_IN_BEGIN_TURN,
    TURN_REVISION,
    TURN_VERSION,
)
from turnstile.runtime.config import Settings
from turnstile.runtime.services import ServiceRegistry
from turnstile.runtime.upgrade import older_turns, turn_version
from turnstile.stores.db import Database
from turnstile.stores.schema import current, ensure_schema
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.workflows import AgentTurn

HISTORIES = Path(__file__).parent / "histories"
V1 = sorted((HISTORIES / "v1").glob("*.json"))
CURRENT = sorted(HISTORIES.glob("*.json"))


def _history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def test_recorded_histories_have_their_version() -> None:
    assert V1 and CURRENT
    assert {p.stem: turn_version(_history(p).events) for p in V1} == {p.stem: 1 for p in V1}
    assert {p.stem: turn_version(_history(p).events) for p in CURRENT} == {
        p.stem: TURN_VERSION for p in CURRENT}


@pytest.mark.parametrize("path", V1, ids=lambda p: p.stem)
async def test_older_histories_do_not_replay_on_this_version(path: Path) -> None:
    replayer = Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(_history(path), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "nondetermin" in str(result.replay_failure).lower()


@workflow.defn(name=WORKFLOW_TYPE)
class VersionOneOpening:
    """Stands in for a turn started by a version-1 worker: its first workflow
    task schedules `turnstile.describe_service`, as v0.1's turn did. Nothing
    serves that activity here, so the turn stays running."""

    @workflow.run
    async def run(self, turn: dict[str, str]) -> None:
        await workflow.execute_activity(DESCRIBE_SERVICE, {"service": ""},
                                        start_to_close_timeout=timedelta(minutes=5))


async def test_worker_refuses_to_start_while_older_turns_run(
        client: Client, temporal_server: DevServer, tmp_path: Path) -> None:
    old_queue = f"old-{uuid.uuid4().hex[:8]}"
    wf_id = f"old-turn-{uuid.uuid4().hex[:8]}"
    # Unsandboxed: the stand-in lives in this test module (paths, fixtures).
    async with Worker(client, task_queue=old_queue, workflows=[VersionOneOpening],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await client.start_workflow(
            WORKFLOW_TYPE, {"conversation_id": "c-old", "user_id": "alice", "message": "hi"},
            id=wf_id, task_queue=old_queue)

        async def scheduled() -> bool:
            return any(t.workflow_id == wf_id for t in await older_turns(client))

        for _ in range(100):
            if await scheduled():
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the version-1 stand-in never scheduled its first activity")
    env = {"TEMPORAL_ADDRESS": temporal_server.address,
           "TURNSTILE_TASK_QUEUE": f"new-{uuid.uuid4().hex[:8]}",
           "DATABASE_URL": f"sqlite:///{tmp_path}/t.db"}
    try:
        log = tmp_path / "refused.log"
        refused = WorkerProcess(log, env)
        with pytest.raises(RuntimeError, match="worker exited"):
            refused.start()
        assert refused.proc is not None
        assert refused.proc.wait(10) == EXIT_OLDER_TURNS
        said = log.read_text()
        # It names the turns (the first ten of the namespace's: other tests'
        # may be listed before this one) and what to do.
        assert "of an older Turnstile version are running" in said and "Drain first" in said
        assert wf_id in said or " more." in said
        # Refused before it migrated anything: the database is as it was (none here).
        assert not (tmp_path / "t.db").exists() or current(Database(env["DATABASE_URL"])) is None
        # A versioned worker refuses too: an unversioned turn (what a release
        # before Worker Versioning leaves) would move to the current version.
        versioned = WorkerProcess(tmp_path / "versioned.log", {
            **env, "TURNSTILE_WORKER_VERSIONING": "on",
            "TURNSTILE_DEPLOYMENT_NAME": f"turnstile-{uuid.uuid4().hex[:8]}"})
        with pytest.raises(RuntimeError, match="worker exited"):
            versioned.start()
        assert versioned.proc is not None and versioned.proc.wait(10) == EXIT_OLDER_TURNS
        # The operator who knows what follows can skip the check.
        forced = WorkerProcess(tmp_path / "forced.log",
                               {**env, "TURNSTILE_UPGRADE_CHECK": "off"}).start()
        forced.stop()
    finally:
        await handle.terminate("test over")
    # Drained: the worker starts.
    started = WorkerProcess(tmp_path / "started.log", env).start()
    try:
        assert started.proc is not None and started.proc.poll() is None
    finally:
        started.stop()
        wait_for(lambda: started.proc is None or started.proc.poll() is not None, 30,
                 "worker stop")


# -- revisions: turns begun at an earlier revision finish as they began ------------

def _worker_at_revision(rt: Runtime, revision: int) -> list[Callable[..., Any]]:
    """The worker's activities, with begin_turn recording `revision` (as a
    worker of that revision would)."""
    registered = all_activities(rt)
    real = next(fn for fn in registered if fn.__name__ == "begin_turn")

    @activity.defn(name=io.BEGIN_TURN)
    async def begin_turn(req: io.BeginTurnInput) -> io.BeginTurnResult:
        if revision < OPENS_IN_BEGIN_TURN:  # such a worker knows no opening
            req = req.model_copy(update={"opening": None})
        result: io.BeginTurnResult = await real(req)
        return result.model_copy(update={"revision": revision})

    return [fn for fn in registered if fn is not real] + [begin_turn]


@pytest.mark.parametrize("revision", [0, 1, 2, TURN_REVISION])
async def test_a_turn_keeps_the_revision_it_began_at(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,
        revision: int) -> None:
    rt = Runtime.build(Settings.from_env({**WORKER_ENV,
                                          "TURNSTILE_TASK_QUEUE": task_queue,
                                          "DATABASE_URL": f"sqlite:///{tmp_path}/t.db",
                                          "LLM_BASE_URL": fake_llm.url}),
                       ServiceRegistry([make_service()]))
    ensure_schema(rt.db)
    received: list[Any] = []
    rt.events.listeners.append(received.append)
    fake_llm.script(tool_reply(("c1", "add", {"a": 1, "b": 2})), text_reply("3"))
    async with build_worker(client, rt, activities=_worker_at_revision(rt, revision),
                            max_cached_workflows=0):  # every task replays the turn
        handle = await Turns(client, rt).start("1+2?")
        result = await handle.result()
    await rt.provider.aclose()
    assert result.status == TurnStatus.COMPLETED and result.answer == "3"
    assert [e.kind for e in received] == ["turn_started", "turn_completed"]
    published = (await local_activities(handle)).count(io.PUBLISH_EVENT)
    # Revision 0: each event a local activity of its own. Revision 1: "turn
    # completed" rides with the release; this service has no retriever, so
    # "turn started" still goes out on its own. Revision 2: it rides with
    # begin_turn (and from revision 3 on).
    assert published == {0: 2, 1: 1}.get(revision, 0)
    # Revision 3: the search attributes (or the memo) are published once
    # begin_turn returns, besides the end: one upsert more.
    history = await handle.fetch_history()
    upserts = [e for e in history.events if e.event_type in (
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED)]
    assert len(upserts) == (2 if revision >= FINDABLE_AT_START else 1), revision


@pytest.mark.parametrize("revision", [1, TURN_REVISION])
async def test_a_cancel_during_a_model_call_ends_as_the_turns_revision_says(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,
        revision: int) -> None:
    """Revision 2 ends a turn cancelled during a model call Canceled; a turn
    begun at revision 1 keeps ending such a cancel as the model call's
    failure, as the history it may have in flight recorded."""
    rt = Runtime.build(Settings.from_env({**WORKER_ENV,
                                          "TURNSTILE_TASK_QUEUE": task_queue,
                                          "DATABASE_URL": f"sqlite:///{tmp_path}/t.db",
                                          "LLM_BASE_URL": fake_llm.url}),
                       ServiceRegistry([make_service()]))
    ensure_schema(rt.db)
    entered, released = threading.Event(), threading.Event()

    def hang(_request: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        released.wait(60)
        return text_reply("too late")

    fake_llm.script(hang)
    try:
        async with build_worker(client, rt, activities=_worker_at_revision(rt, revision),
                                max_cached_workflows=0):  # every task replays the turn
            handle = await Turns(client, rt).start("hello")
            await asyncio.to_thread(entered.wait, 30)
            await handle.cancel()
            if revision >= CANCEL_ENDS_CANCELLED:
                with pytest.raises(WorkflowFailureError) as failed:
                    await handle.result()
                assert isinstance(failed.value.cause, CancelledError)
            else:
                result = await handle.result()
                assert result.status == TurnStatus.FAILED
                assert result.error is not None and result.error.type == "CancelledError"
    finally:
        released.set()
        await rt.provider.aclose()
