"""The door: hostile input from users and operators ends its turn `refused`
with `InvalidTurnInput` within seconds, holding nothing, on both databases —
and the next turn on the conversation completes (turnstile.engine.turn_input_rules).
Also: a value the database refuses is never retried as an outage
(activities.data_errors)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.converter import DataConverter
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.worker import Worker

from tests.support.services import make_service
from tests.support.sql import fetchall, fetchone
from tests.support.temporal_server import DevServer
from tests.support.turns import running_worker
from turnstile.activities.data_errors import DataErrors
from turnstile.engine.contract import WORKFLOW_TYPE, TurnInput, TurnResult, TurnStatus
from turnstile.engine.turn_input_rules import (
    MESSAGE_MAX,
    clean_note,
    id_problem,
    turn_input_problem,
)
from turnstile.runtime.client import PydanticPayloadConverter
from turnstile.runtime.devstack import temporal_binary
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply

HOSTILE: dict[str, dict[str, str]] = {
    "NUL in the message": {"message": "hello\x00world"},
    "NUL in user_id": {"user": "al\x00ice"},
    "NUL in conversation_id": {"conversation": "c\x00"},
    "zero-width in user_id": {"user": "ali\u200bce"},
    "line separator in conversation_id": {"conversation": "c\u2028x"},
    "escape in user_id": {"user": "alice\x1b[31m"},
    "padded user_id": {"user": " alice "},
    "overlong conversation_id": {"conversation": "c" * 201},
    "a 1 MB message": {"message": "x" * 1_000_000},
    "NUL in a service name": {"service": "te\x00st"},
}


def test_rules_name_the_field_and_the_figure() -> None:
    def problem(**kw: Any) -> str | None:
        base = {"conversation_id": "c-1", "user_id": "alice", "message": "hi"}
        return turn_input_problem(TurnInput(**{**base, **kw}))

    assert problem() is None
    assert problem(message="tab\tnew\nline, émoji 🙂, U+2028 \u2028 in text") is None
    assert "1,000,000 characters; the limit is 100,000" in (problem(message="x" * 1_000_000)
                                                            or "")
    assert problem(message="x" * MESSAGE_MAX) is None
    assert "user_id" in (problem(user_id="a\u200db") or "")
    assert "\\u200d" in (problem(user_id="a\u200db") or "")  # quoted escaped, storable
    assert "conversation_id" in (problem(conversation_id="x" * 201) or "")
    assert "lone surrogate" in (problem(message="a\ud800") or "")
    assert "variables" in (problem(variables={"k": ["ok", "b\x00"]}) or "")
    assert id_problem("reviewer", "\ufffd") is not None
    for refused in [problem(user_id="a\x00"), problem(message="\udfff")]:
        assert refused is not None
        refused.encode("utf-8")  # the refusal itself can be stored anywhere
        assert "\x00" not in refused
    assert clean_note("ok\x00\ud800" + "n" * 5000) == "ok\ufffd\ufffd" + "n" * 3996


def _holdings(db: Database, conversation: str) -> tuple[int, int, int]:
    with db.connect() as conn:
        def count(table: str) -> int:
            row = fetchone(conn, f"SELECT COUNT(*) AS n FROM {table} "  # noqa: S608
                                 "WHERE conversation_id = :c", {"c": conversation})
            return int(row["n"]) if row else 0
        return count("conversation_lock"), count("chat_message"), count("conversation")


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_input_is_refused_and_holds_nothing(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer,
        case: str) -> None:
    fake_llm.default = lambda _req: text_reply("fine")
    kw = HOSTILE[case]
    conversation = kw.get("conversation", f"door-{uuid.uuid4().hex[:8]}")
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start(kw.get("message", "hi"), conversation=conversation,
                                   user=kw.get("user", "alice"),
                                   service=kw.get("service", "test"))
        result = await asyncio.wait_for(handle.result(), 15)
        assert result.status == TurnStatus.REFUSED, result
        assert result.error is not None and result.error.type == "InvalidTurnInput"
        events = [e.event_type for e in (await handle.fetch_history()).events]
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events
        assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in events
        safe = conversation.replace("\x00", "")
        assert _holdings(db, safe) == (0, 0, 0)
        # the next turn on the conversation (as a valid id) completes
        after = await turns.run("and now?", conversation=safe if safe.strip() == safe
                                and len(safe) <= 200 and "\u2028" not in safe
                                else f"next-{uuid.uuid4().hex[:6]}")
        assert after.status == TurnStatus.COMPLETED, after.error
    assert fake_llm.requests, "the valid turn asked the model"


async def test_lone_surrogate_from_the_cli_is_refused(
        temporal_server: DevServer, task_queue: str, db: Database,
        fake_llm: FakeOpenAIServer) -> None:
    """`temporal workflow start --input` passes a lone surrogate escape through;
    the project's converter reads it and the door refuses it (it used to fail
    the turn on its own input)."""
    fake_llm.default = lambda _req: text_reply("fine")
    client = await Client.connect(temporal_server.address, data_converter=DataConverter(
        payload_converter_class=PydanticPayloadConverter))
    conversation = f"sur-{uuid.uuid4().hex[:8]}"
    wf_id = f"t-{uuid.uuid4().hex[:10]}"
    raw = json.dumps({"conversation_id": conversation, "user_id": "alice", "service": "test",
                      "message": "hi @@ there"}).replace("@@", "\\ud800")
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        subprocess.run([temporal_binary(), "workflow", "start", "--address",
                        temporal_server.address, "--task-queue", task_queue, "--type",
                        WORKFLOW_TYPE, "--workflow-id", wf_id, "--input", raw],
                       check=True, capture_output=True, timeout=30)
        handle = client.get_workflow_handle(wf_id, result_type=TurnResult)
        result = await asyncio.wait_for(handle.result(), 15)
        assert result.status == TurnStatus.REFUSED
        assert result.error is not None and result.error.type == "InvalidTurnInput"
        assert "lone surrogate" in result.error.message
        assert _holdings(db, conversation) == (0, 0, 0)
        assert (await turns.run("hi", conversation=conversation)).status == \
            TurnStatus.COMPLETED


# -- a value the database refuses -------------------------------------------------

@activity.defn(name="test.store_text")
def store_text(url_and_text: list[str | None]) -> None:
    url, text = url_and_text
    assert url is not None
    with Database(url).connect() as conn:
        conn.execute("INSERT INTO conversation (conversation_id, user_id) VALUES (:c, 'u')",
                     {"c": text})


@workflow.defn(name="test.StoreText", sandboxed=False)
class StoreText:
    @workflow.run
    async def run(self, url_and_text: list[str | None]) -> None:
        await workflow.execute_activity(
            "test.store_text", url_and_text, start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100),
                                     maximum_attempts=50))


async def test_a_value_the_database_refuses_is_not_retried(
        client: Client, task_queue: str, db: Database) -> None:
    bad = "c\x00" if db.dialect == "postgresql" else None  # SQLite: NOT NULL refuses None
    async with Worker(client, task_queue=task_queue, workflows=[StoreText],
                      activities=[store_text], interceptors=[DataErrors()],
                      activity_executor=ThreadPoolExecutor(2)):
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(StoreText.run, [db.url, bad],
                                          id=f"st-{uuid.uuid4().hex[:8]}", task_queue=task_queue,
                                          execution_timeout=timedelta(seconds=20))
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
    assert cause.cause.type == "DatabaseRefusedData" and cause.cause.non_retryable
    assert cause.retry_state == RetryState.NON_RETRYABLE_FAILURE
    assert "\x00" not in json.dumps(str(cause.cause))


async def test_a_message_no_model_can_read_is_refused_before_it_is_stored(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    """Within the door's character limit but over the model's context: the
    model call refuses it (MessageTooLong) before storing or sending it; the
    turn ends `refused` with the figures, the conversation holds nothing of it,
    and the next turn on it completes."""
    fake_llm.default = lambda _req: text_reply("fine")
    conversation = f"long-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url,
                              env={"TURNSTILE_CONTEXT_TOKENS": "2000"}) as turns:
        handle = await turns.start(" ".join(f"word{i}" for i in range(6000)),
                                   conversation=conversation)
        result = await asyncio.wait_for(handle.result(), 15)
        assert result.status == TurnStatus.REFUSED, result
        assert result.error is not None and result.error.type == "MessageTooLong"
        assert "reads at most 2,000" in result.error.message
        assert not fake_llm.requests  # never sent
        with db.connect() as conn:
            stored = fetchall(conn, "SELECT role FROM chat_message WHERE conversation_id = :c",
                                    {"c": conversation})
            locks = fetchall(conn, "SELECT * FROM conversation_lock WHERE conversation_id = :c",
                                   {"c": conversation})
        assert stored == [] and locks == []
        after = await turns.run("a short one", conversation=conversation)
        assert after.status == TurnStatus.COMPLETED, after.error
    assert len(fake_llm.requests) == 1
    assert all(m.get("content") != "" for m in fake_llm.requests[0]["messages"])
