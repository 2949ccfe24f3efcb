"""No turn can hang: a bookkeeping activity that fails for good
ends the turn with a status (never an endless workflow-task retry), and the
conversation is usable by the next turn. Stand-in activities registered under
the real names fail non-retryably, as a database that refuses for good would."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from tests.support.services import make_service
from tests.support.turns import Turns
from tests.support.worker_env import WORKER_ENV
from turnstile.activities import Runtime, all_activities
from turnstile.cli.worker import build_worker
from turnstile.engine import activity_io as io
from turnstile.engine.contract import TurnStatus
from turnstile.runtime.config import Settings
from turnstile.runtime.services import ServiceRegistry
from turnstile.stores.schema import ensure_schema
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


@activity.defn(name=io.RELEASE_CONVERSATION)
def broken_release(req: io.ReleaseInput) -> None:
    raise ApplicationError("the lock table refuses writes", non_retryable=True)


@activity.defn(name=io.RECORD_COMPENSATION_FAILURE)
def broken_record(req: io.CompensationFailure) -> None:
    raise ApplicationError("the audit table refuses writes", non_retryable=True)


def runtime(task_queue: str, url: str, llm_url: str) -> Runtime:
    rt = Runtime.build(Settings.from_env({**WORKER_ENV,
                                          "TURNSTILE_TASK_QUEUE": task_queue,
                                          "DATABASE_URL": url, "LLM_BASE_URL": llm_url}),
                       ServiceRegistry([make_service()]))
    ensure_schema(rt.db)
    return rt


def with_stand_in(rt: Runtime, stand_in: Callable[..., Any]) -> list[Callable[..., Any]]:
    name = stand_in.__name__.removeprefix("broken_")
    replaced = [fn for fn in all_activities(rt) if not fn.__name__.startswith(name)]
    assert len(replaced) == len(all_activities(rt)) - 1
    return [*replaced, stand_in]


async def no_task_failures(handle: Any) -> bool:
    history = await handle.fetch_history()
    return all(e.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in history.events)


async def test_a_release_that_fails_for_good_still_ends_the_turn(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    rt = runtime(task_queue, f"sqlite:///{tmp_path}/t.db", fake_llm.url)
    conv = f"c-{uuid.uuid4().hex[:6]}"
    fake_llm.script(text_reply("first"), text_reply("second"))
    received: list[Any] = []
    rt.events.listeners.append(received.append)
    async with build_worker(client, rt, activities=with_stand_in(rt, broken_release)):
        turns = Turns(client, rt)
        first = await turns.start("hello", conversation=conv)
        one = await first.result()
        events = await first.query("status")
        two = await turns.run("again", conversation=conv)  # takes over the ended turn's lock
        clean = await no_task_failures(first)
    await rt.provider.aclose()
    assert one.status == TurnStatus.COMPLETED and one.answer == "first"
    assert any(e["step"] == "release_failed" for e in events["events"])
    assert two.status == TurnStatus.COMPLETED and two.answer == "second"
    assert clean
    # The "turn completed" event the failed release would have delivered went
    # out on its own (publish_event), for both turns.
    first_events = [e.kind for e in received if e.workflow_id == first.id]
    assert first_events == ["turn_started", "turn_completed"]
    assert [e.kind for e in received].count("turn_completed") == 2


async def test_an_unrecordable_compensation_failure_still_ends_the_turn(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    rt = runtime(task_queue, f"sqlite:///{tmp_path}/t.db", fake_llm.url)
    fake_llm.script(tool_reply(("s1", "stickyReserve", {"item": "x"})),
                    tool_reply(("m1", "mustSucceed", {})))
    async with build_worker(client, rt, activities=with_stand_in(rt, broken_record)):
        handle = await Turns(client, rt).start("book", conversation=f"c-{uuid.uuid4().hex[:6]}")
        result = await handle.result()
        clean = await no_task_failures(handle)
    await rt.provider.aclose()
    assert result.status == TurnStatus.COMPENSATION_FAILED
    assert result.error is not None and "stickyReserve (s1)" in result.error.message
    assert clean
