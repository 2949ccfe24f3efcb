"""Expand, then contract, tried as an operator upgrades: the previous
release's worker keeps working on the schema this release migrates to.

The previous release is read from RELEASES.md (tests/support/releases.py: the
newest row whose version is not the package's), its commit extracted from git
history with `git archive` and run as its own `worker.py` process (with this
environment's libraries: the releases share their dependencies). It starts on
its own schema and parks a turn on the approval of an e-mail; this release's
migrations then run (as the new worker's start runs them); the reviewer
approves; the old worker completes the turn on the migrated schema — the
e-mail task in the outbox, the decision and the audit row recorded — and a new
turn on it completes too. (The whole rollout, with Worker Versioning, a
restart of the old worker and a rollback: tests/test_rollout.py.)
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from temporalio.client import Client

from tests.support.releases import head_of, previous_release, release_tree
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
from turnstile.stores.db import Database
from turnstile.stores.schema import current, head_revision, upgrade
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MAIL = {"to": "ops@example.com", "subject": "Follow up", "body": "C0001"}


async def test_the_previous_release_completes_an_approved_email_on_the_migrated_schema(
        client: Client, temporal_server: DevServer, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    old = release_tree(previous_release(), tmp_path / "previous")
    previous_head = head_of(old)
    url = f"sqlite:///{tmp_path}/t.db"
    queue = f"prev-{uuid.uuid4().hex[:8]}"
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": queue,
           "DATABASE_URL": url, "LLM_BASE_URL": fake_llm.url,
           "TURNSTILE_DATA_DIR": str(tmp_path / "data")}

    def reply(request: dict) -> object:  # type: ignore[type-arg]
        if any(m.get("role") == "tool" for m in request["messages"]):
            return text_reply("queued")
        return tool_reply((f"e-{uuid.uuid4().hex[:6]}", "createEmailTask", MAIL))

    fake_llm.default = reply
    # v0.2 sends "content": null beside tool calls (OpenAI takes it; this
    # release sends "", which llama-cpp-python takes too).
    fake_llm.null_content_refused = False
    worker = WorkerProcess(tmp_path / "previous.log", env, root=old).start()
    try:
        db = Database(url)
        assert current(db) == previous_head  # the old worker made its own schema
        conversation = f"c-{uuid.uuid4().hex[:6]}"
        handle = await client.start_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id=conversation, user_id="alice",
                                     message="mail ops", service="sales-assistant"),
            id=f"prev-{uuid.uuid4().hex[:8]}", task_queue=queue, result_type=TurnResult)
        [pending] = await wait_pending(handle)
        upgrade(db)  # this release's migrations, as its worker runs them on start
        assert current(db) == head_revision()
        await handle.signal("approve", ApproveSignal(tool_call_id=pending.tool_call_id,
                                                     reviewer="carol"))
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.status == TurnStatus.COMPLETED, result.error
        assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
        after = await client.execute_workflow(
            WORKFLOW_TYPE, TurnInput(conversation_id=conversation, user_id="alice",
                                     message="and again", service="sales-assistant"),
            id=f"prev-{uuid.uuid4().hex[:8]}", task_queue=queue, result_type=TurnResult)
        assert after.status == TurnStatus.COMPLETED, after.error
    finally:
        worker.stop()
    with db.connect() as conn:
        mails = fetchall(conn, "SELECT recipient FROM email_task")
        decisions = fetchall(conn, "SELECT reviewer, approved, edited_arguments FROM "
                                   "approval_decision WHERE workflow_id = :wf", {"wf": handle.id})
        audit = fetchall(conn, "SELECT status FROM tool_execution_log WHERE workflow_id = :wf",
                               {"wf": handle.id})
    # The old worker's decision: the columns it knows, the new one (0010) left NULL.
    assert len(mails) == 1 and decisions == [
        {"reviewer": "carol", "approved": 1, "edited_arguments": None}]
    assert [a["status"] for a in audit] == ["COMPLETED"]
