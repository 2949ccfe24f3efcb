"""No exception leaves a turn retrying forever, whatever raised it
(docs/errors.md).

A worker built with a fault-injecting interceptor (tests/support/faults.py,
after the product's own) raises an exception nobody planned for — KeyError,
TypeError, a pydantic serialization error — first from workflow code at each
point where the turn schedules work (each pipeline step, the ending
included), then from inside each activity the turn runs. Every such turn
ends within seconds, typed: `failed` with `UnexpectedError` naming the step
and the exception class (workflow code), or with the activity's
`UnreadableData` failure, attempted once (activities). No workflow task
fails, the conversation is released, and its next turn completes. On SQLite
and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner

from tests.support.faults import FAULTS, Faults, activity_fault_id, workflow_fault_id
from tests.support.services import make_service
from tests.support.sql import fetchone
from tests.support.turns import Turns, local_activities, running_worker
from turnstile.activities.data_errors import DataErrors
from turnstile.activities.log_context import LogContext
from turnstile.engine.contract import TurnPhase, TurnResult, TurnStatus
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

EXCEPTIONS = sorted(FAULTS)
PHASES = {p.value for p in TurnPhase} | {s.value for s in TurnStatus}


def tool_then_answer(request: dict[str, Any]) -> dict[str, Any]:
    """One round of `echo`, then an answer: any turn, any conversation."""
    messages = request["messages"]
    if messages[-1].get("role") == "tool":
        return text_reply("done")
    return tool_reply((f"e{len(messages)}", "echo", {"text": "hi"}))


def worker(client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> Any:
    # Unsandboxed: the fault's counter lives in the interceptor instance.
    return running_worker(client, task_queue, db.url, [make_service()], llm_url=fake_llm.url,
                          interceptors=[DataErrors(), LogContext(), Faults()],
                          workflow_runner=UnsandboxedWorkflowRunner())


async def events_of(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    return list((await handle.fetch_history()).events)


def lock_rows(db: Database, conversation: str) -> int:
    with db.connect() as conn:
        row = fetchone(conn, "SELECT COUNT(*) AS n FROM conversation_lock "
                             "WHERE conversation_id = :c", {"c": conversation})
    return int(row["n"]) if row else 0


async def ended(turns: Turns, workflow_id: str, conversation: str
                ) -> tuple[TurnResult, list[Any]]:
    handle = await turns.start("hello", conversation=conversation, workflow_id=workflow_id)
    result = await asyncio.wait_for(handle.result(), timeout=30)
    return result, await events_of(handle)


async def the_next_turn_completes(turns: Turns, db: Database, conversation: str) -> None:
    assert lock_rows(db, conversation) == 0, "the conversation was not released"
    after = await asyncio.wait_for(turns.run("again", conversation=conversation), timeout=30)
    assert after.status == TurnStatus.COMPLETED, after.error


async def test_an_exception_from_any_step_ends_the_turn_typed(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = tool_then_answer
    async with worker(client, task_queue, db, fake_llm) as turns:
        clean = await turns.start("hello", conversation=f"c-{uuid.uuid4().hex[:6]}")
        assert (await clean.result()).status == TurnStatus.COMPLETED
        history = await events_of(clean)
        scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name
                     for e in history
                     if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
        local = await local_activities(clean)
        points = len(scheduled) + len(local)
        assert points >= 4, (scheduled, local)
        steps = set()
        for k in range(1, points + 1):
            exception = EXCEPTIONS[k % len(EXCEPTIONS)]
            conv = f"c-w{k}-{uuid.uuid4().hex[:6]}"
            result, events = await ended(
                turns, workflow_fault_id(k, exception, uuid.uuid4().hex[:8]), conv)
            assert result.status == TurnStatus.FAILED, (k, result)
            assert result.error is not None and result.error.type == "UnexpectedError"
            assert result.error.exception == exception, result.error
            assert result.error.step in PHASES, result.error
            assert f"raised {exception}" in result.error.message
            assert not [e for e in events
                        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
            steps.add(result.error.step)
            await the_next_turn_completes(turns, db, conv)
    # Faults reached the turn in more than one step (begin, model call, tools, ending).
    assert {"load_memory", "model_call", "tools"} <= steps, steps


async def test_an_exception_inside_any_activity_fails_it_at_once(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = tool_then_answer
    async with worker(client, task_queue, db, fake_llm) as turns:
        clean = await turns.start("hello", conversation=f"c-{uuid.uuid4().hex[:6]}")
        assert (await clean.result()).status == TurnStatus.COMPLETED
        history = await events_of(clean)
        types = {e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in history
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
        types |= set(await local_activities(clean))
        assert {"turnstile.begin_turn", "turnstile.call_model",
                "turnstile.execute_tool"} <= types, types
        for i, activity_type in enumerate(sorted(types)):
            exception = EXCEPTIONS[i % len(EXCEPTIONS)]
            conv = f"c-a{i}-{uuid.uuid4().hex[:6]}"
            loop = asyncio.get_running_loop()
            began = loop.time()
            result, events = await ended(
                turns, activity_fault_id(activity_type, exception, uuid.uuid4().hex[:8]), conv)
            took = loop.time() - began
            assert took < 10, (activity_type, took)  # not retried for the activity's window
            assert not [e for e in events
                        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
            attempts = [e.activity_task_started_event_attributes.attempt for e in events
                        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
            assert all(a == 1 for a in attempts), (activity_type, attempts)
            if activity_type == "turnstile.execute_tool":
                # A tool's activity that fails for good is a tool error the
                # model reads (docs/errors.md); the turn goes on.
                call = result.tool_calls[0]
                assert call.is_error and "could not read" in call.result_preview, call
            elif activity_type == "turnstile.release_conversation":
                # The turn keeps its status; the next turn takes the lock over.
                assert result.status == TurnStatus.COMPLETED, result
            else:
                assert result.status in (TurnStatus.FAILED, TurnStatus.REFUSED), result
                assert result.error is not None and result.error.type == "UnreadableData", \
                    (activity_type, result.error)
                assert activity_type in result.error.message, result.error
            if activity_type != "turnstile.release_conversation":
                assert lock_rows(db, conv) == 0, activity_type
            after = await asyncio.wait_for(turns.run("again", conversation=conv), timeout=30)
            assert after.status == TurnStatus.COMPLETED, (activity_type, after.error)
