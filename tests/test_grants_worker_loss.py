"""A standing approval's use is counted once whatever happens to the worker
(docs/approvals.md, "How a call is covered"): a `python worker.py`
subprocess is SIGKILLed in the middle of a turn whose mail a grant approved
(its next model request held open), another worker finishes the turn; and a
call that claims again (a retried or reset turn) gets the same grant without
a second use. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from tests.support.sql import fetchall
from tests.support.waiting import wait_until
from tests.support.worker_loss import HangingReply, ProcessTurns, activity_runs
from turnstile.engine.activity_io import CALL_MODEL, CLAIM_GRANT
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.grant_models import Equals, Grant, GrantScope
from turnstile.stores import grant_store, truth
from turnstile.stores.db import Database
from turnstile.stores.tables import stored_time
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MAIL = {"to": "ops@example.com", "subject": "numbers", "body": "Please follow up."}


def ops_grant(grant_id: str = "g-ops", uses: int = 3) -> Grant:
    now = datetime.now(UTC)
    return Grant(grant_id=grant_id, service="sales-assistant", tool_name="createEmailTask",
                 scope=GrantScope.SERVICE, scope_key="sales-assistant",
                 constraints={"to": Equals(value="ops@example.com")},
                 until=stored_time(now + timedelta(hours=1)), max_uses=uses, issued_by="bob",
                 issued_at=stored_time(now))



async def test_a_worker_killed_in_a_covered_turn_uses_the_grant_once(
        db_process_turns: ProcessTurns, fake_llm: FakeOpenAIServer) -> None:
    turns = db_process_turns
    hang = HangingReply()
    fake_llm.script(tool_reply(("m1", "createEmailTask", MAIL)), hang,
                    text_reply("mailed ops"))
    db = turns.db
    wf_id = f"grant-kill-{turns.task_queue}"
    first = turns.worker("worker1")
    try:
        grant_store.issue(db, ops_grant(), chain="")
        handle = await turns.start(wf_id, "mail ops", service="sales-assistant")
        await wait_until(hang.entered.is_set, timeout=30, what="the second model request")
    finally:
        first.kill()  # SIGKILL after the covered call ran, while the turn goes on
    assert grant_store.get(db, "g-ops").uses == 1
    second = turns.worker("worker2")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        hang.released.set()
        second.stop()
    assert result.status is TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
    [(_, model_run)] = (await activity_runs(handle, CALL_MODEL))[1:]
    assert model_run.activity_task_started_event_attributes.attempt == 2  # the kill happened
    assert len(await activity_runs(handle, CLAIM_GRANT)) == 1
    assert grant_store.get(db, "g-ops").uses == 1
    with db.connect() as conn:
        uses = fetchall(conn, "SELECT grant_id, tool_call_id FROM grant_use")
        audit = fetchall(conn, "SELECT grant_id, status FROM tool_execution_log WHERE "
                               "workflow_id = :w", {"w": wf_id})
        mails = fetchall(conn, "SELECT recipient FROM email_task")
    assert uses == [{"grant_id": "g-ops", "tool_call_id": "m1"}]
    assert audit == [{"grant_id": "g-ops", "status": "COMPLETED"}]
    assert mails == [{"recipient": "ops@example.com"}]
    assert truth.grant_disagreements_of(db) == []


def test_a_call_claiming_again_gets_the_same_grant_once(db: Database) -> None:
    """What a retried claim activity, a reset run (same execution chain) or a
    worker lost after the claim committed asks: the same answer, one use."""
    grant_store.issue(db, ops_grant(uses=2), chain="")
    call = grant_store.CallOf(workflow_id="t-1", chain="run-1", tool_call_id="m1",
                              service="sales-assistant", tool_name="createEmailTask",
                              conversation_id="c-1", user_id="alice", arguments=MAIL)
    first, again = grant_store.claim(db, call), grant_store.claim(db, call)
    assert first.grant is not None and again.grant is not None
    assert first.grant.grant_id == again.grant.grant_id == "g-ops"
    assert grant_store.get(db, "g-ops").uses == 1
    other = grant_store.claim(db, grant_store.CallOf(**{**call.__dict__, "tool_call_id": "m2"}))
    assert other.grant is not None and grant_store.get(db, "g-ops").uses == 2
    third = grant_store.claim(db, grant_store.CallOf(**{**call.__dict__, "tool_call_id": "m3"}))
    assert third.grant is None
    assert [(c.grant_id, c.why_not) for c in third.candidates] == [("g-ops", "all 2 uses taken")]
    # Revoked: nothing more, not even for a call that asks for the first time.
    grant_store.revoke(db, "g-ops", "carol")
    grant_store.issue(db, ops_grant("g-two"), chain="")
    grant_store.revoke(db, "g-two", "carol")
    fourth = grant_store.claim(db, grant_store.CallOf(**{**call.__dict__, "tool_call_id": "m4"}))
    assert fourth.grant is None and fourth.candidates == []
    # ... but the call that claimed before keeps its answer (it already ran under it).
    assert grant_store.claim(db, call).grant is not None
    assert grant_store.get(db, "g-ops").uses == 2
