"""Turns on worker subprocesses that a test kills (SIGKILL) or stops
(SIGTERM), and what such a test reads back: the turn's activity attempts
from its history, the test tools' rows (tests/test_worker_loss.py,
tests/test_worker_shutdown.py)."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, TaskQueueKind, TimeoutType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle

from tests.support.sql import fetchall, fetchone
from tests.support.worker_process import WorkerProcess
from turnstile.engine.contract import WORKFLOW_TYPE, TurnInput, TurnResult
from turnstile.engine.specs import DEFAULT_HEARTBEAT_SECONDS
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply
from turnstile.testing.processes import DevServer


class HangingReply:
    """A model reply that holds its HTTP request open until released, as a
    model that is still thinking when the worker dies."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.entered.set()
        self.released.wait(120)
        return text_reply("too late: this worker is gone")


class ProcessTurns:
    """Turns run by `python worker.py` subprocesses (WorkerProcess) that a
    test kills or stops, on the test's task queue and database (SQLite by
    default)."""

    def __init__(self, client: Client, server: DevServer, task_queue: str, tmp: Path,
                 llm_url: str, db_url: str | None = None) -> None:
        self.client, self.task_queue, self.tmp = client, task_queue, tmp
        db_url = db_url or f"sqlite:///{tmp}/t.db"
        self.db = Database(db_url)
        self.env = {"TEMPORAL_ADDRESS": server.address, "TURNSTILE_TASK_QUEUE": task_queue,
                    "DATABASE_URL": db_url, "LLM_BASE_URL": llm_url}

    def worker(self, name: str, **env: str) -> WorkerProcess:
        return WorkerProcess(self.tmp / f"{name}.log", {**self.env, **env}).start()

    async def start(self, wf_id: str, message: str, service: str = "test",
                    task_timeout: timedelta | None = None) -> WorkflowHandle[Any, TurnResult]:
        """`task_timeout`: the turn's workflow task timeout (None: Temporal's 10 s)."""
        return await self.client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id=f"c-{wf_id}", user_id="alice",
                                     message=message, service=service,
                                     variables={"team": "ops"}),
            id=wf_id, task_queue=self.task_queue, result_type=TurnResult,
            task_timeout=task_timeout)



@pytest.fixture
def db_process_turns(client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
                     fake_llm: FakeOpenAIServer, db: Database) -> ProcessTurns:
    """ProcessTurns on the test's `db`: SQLite and PostgreSQL."""
    return ProcessTurns(client, temporal_server, task_queue, tmp_path, fake_llm.url, db.url)

def notes(db: Database, wf_id: str) -> list[str]:
    """The test tools' rows of one turn, read without writing (the tools'
    transaction may hold SQLite's write lock)."""
    with db.connect() as conn:
        return [r["note"] for r in fetchall(conn,
            "SELECT note FROM test_side_effect WHERE call_key LIKE :k", {"k": wf_id + "/%"})]


async def activity_runs(handle: WorkflowHandle[Any, TurnResult],
                        name: str) -> list[tuple[HistoryEvent, HistoryEvent]]:
    """(scheduled, started) event pairs of one activity type. The started event
    of a retried activity carries the final attempt and the previous attempt's
    failure (the server records only the last attempt)."""
    history = await handle.fetch_history()
    scheduled = {e.event_id: e for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name == name}
    return [(scheduled[e.activity_task_started_event_attributes.scheduled_event_id], e)
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            and e.activity_task_started_event_attributes.scheduled_event_id in scheduled]


async def sticky_timeouts(
        handle: WorkflowHandle[Any, TurnResult]) -> list[tuple[HistoryEvent, HistoryEvent]]:
    """(scheduled, timed out) event pairs of the workflow tasks that waited on
    a sticky queue until their schedule-to-start timeout: the turn's tasks
    put on the queue of a worker that was gone."""
    history = await handle.fetch_history()
    by_id = {e.event_id: e for e in history.events}
    pairs = []
    for e in history.events:
        timed_out = e.workflow_task_timed_out_event_attributes
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT \
                and timed_out.timeout_type == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START:
            scheduled = by_id[timed_out.scheduled_event_id]
            queue = scheduled.workflow_task_scheduled_event_attributes.task_queue
            if queue.kind == TaskQueueKind.TASK_QUEUE_KIND_STICKY:
                pairs.append((scheduled, e))
    return pairs


def ledger_status(db: Database, wf_id: str, call_id: str) -> str | None:
    with db.connect() as conn:
        row = fetchone(conn, "SELECT status FROM tool_call_ledger WHERE workflow_id = :wf "
                             "AND tool_call_id = :c", {"wf": wf_id, "c": call_id})
    return None if row is None else str(row["status"])


def after_heartbeat_timeout(scheduled: HistoryEvent, started: HistoryEvent) -> None:
    """The activity had the default heartbeat timeout, and its last attempt
    is the second one, started because the first one's heartbeats stopped."""
    attrs = scheduled.activity_task_scheduled_event_attributes
    assert attrs.heartbeat_timeout.ToTimedelta() == timedelta(seconds=DEFAULT_HEARTBEAT_SECONDS)
    run = started.activity_task_started_event_attributes
    assert run.attempt == 2
    timeout = run.last_failure.timeout_failure_info
    assert timeout.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT, run.last_failure
