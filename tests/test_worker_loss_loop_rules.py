"""A worker lost at the model loop's v0.4 steps: each test SIGKILLs a real
worker process (tests/support/worker_process.py) at one step, starts a fresh
one, and checks that the turn ends as it would have without the kill and
that nothing was done twice. Real components: a Temporal dev server, the
scripted model server over HTTP, SQLite.

Where the worker dies is chosen, not timed: the scripted model holds a
chosen request open (`HangingReply`) until the worker is gone, or a tool
marks that it is inside its uncommitted transaction; the test kills only
once that has happened, and first checks what is recorded by then (audit
rows, discarded answers, no committed row).

- the repeat breaker (turnstile.engine.repeats): killed while the model call
  whose retry asks for the identical e-mail is in flight, and while the one
  after the repeat was settled is (calls parsed by the server, and calls
  written as text on `sales-compact`); and while the answer asked for
  without tools after two repeats is in flight;
- the empty-answer re-ask (turnstile.engine.answer_rules): killed while the
  re-ask is in flight; the second answer completes the turn, or, empty too,
  ends it `failed` (`EmptyAnswer`);
- the made-up-result re-ask (revision 9, answer_rules.fabricated_result):
  killed while the re-ask is in flight; the second answer completes the
  turn, or, a made-up result again, ends it `failed` (`FabricatedToolResult`);
- calls written as text (ModelSettings.text_tool_calls): killed inside the
  journaled tool the answer's text called.

The lost attempt is noticed by its heartbeat timeout (5 s by default) and
retried by the next worker; every assertion is on the history, the database
and the requests the model received, never on wall time."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.support.services import side_effects
from tests.support.sql import fetchall
from tests.support.turns import wait_pending
from tests.support.waiting import wait_until
from tests.support.worker_loss import (
    HangingReply,
    ProcessTurns,
    activity_runs,
    after_heartbeat_timeout,
    ledger_status,
    notes,
)
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import CALL_MODEL, EXECUTE_TOOL
from turnstile.engine.answer_rules import EMPTY_NUDGE, FABRICATED_NUDGE
from turnstile.engine.contract import (
    ApproveSignal,
    CallStatus,
    Handlers,
    PendingApproval,
    TurnResult,
    TurnStatus,
)
from turnstile.engine.repeats import ANSWER_NOW
from turnstile.sales import truth
from turnstile.stores.audit import AuditLog
from turnstile.testing import FakeOpenAIServer, ScriptedReply, text_reply, tool_reply
from turnstile.testing.processes import DevServer

MAIL = {"to": "ops@example.com", "subject": "Follow up", "body": "C0001 and C0002"}
# The same arguments, spelled differently: the breaker compares JSON values.
MAIL_AGAIN = '{"body": "C0001 and C0002",  "subject": "Follow up", "to": "ops@example.com"}'


@pytest.fixture
def turns(client: Client, temporal_server: DevServer, task_queue: str, tmp_path: Path,
          fake_llm: FakeOpenAIServer) -> ProcessTurns:
    return ProcessTurns(client, temporal_server, task_queue, tmp_path, fake_llm.url)


async def resumed(turns: ProcessTurns, handle: WorkflowHandle[Any, TurnResult],
                  hang: HangingReply | None = None) -> TurnResult:
    """After the kill: a fresh worker ends the turn; then the held request
    (if any) is let go and the second worker stopped."""
    second = turns.worker("worker2")
    try:
        try:
            return await asyncio.wait_for(handle.result(), timeout=90)
        except TimeoutError:
            pending = await handle.query(Handlers.PENDING_APPROVALS,
                                         result_type=list[PendingApproval])
            raise AssertionError(f"the turn did not end; it waits for: {pending}") from None
    finally:
        if hang is not None:
            hang.released.set()
        second.stop()


async def no_failed_workflow_tasks(handle: WorkflowHandle[Any, TurnResult]) -> None:
    """The fresh worker replayed the turn up to the kill as it had run (a
    replay that decided otherwise fails its workflow task: nondeterminism)."""
    history = await handle.fetch_history()
    assert not [e for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]


def answered(fake_llm: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [r for r in fake_llm.requests if "_refused" not in r]


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]


def audit(turns: ProcessTurns, wf_id: str) -> list[tuple[str, str]]:
    return [(r.tool_name, r.status.value) for r in AuditLog(turns.db).rows(wf_id)]


def stored_assistant(turns: ProcessTurns, conv: str) -> list[tuple[str, str | None]]:
    """The turn's stored assistant answers (content, discarded reason), raw:
    discarded ones included."""
    with turns.db.connect() as conn:
        rows = fetchall(conn, "SELECT content, attributes FROM chat_message WHERE "
                              "conversation_id = :c AND role = 'assistant' ORDER BY seq",
                        {"c": conv})
    return [(r["content"] or "", json.loads(r["attributes"] or "{}").get(attr.DISCARDED))
            for r in rows]


# --- the repeat breaker --------------------------------------------------------

def as_text(call: str) -> dict[str, Any]:
    """createEmailTask written as text, as llama-cpp-python's chatml-function-calling
    writes it (`sales-compact` reads it: text_tool_calls)."""
    return text_reply(f"functions.createEmailTask:\n{call}")


@pytest.mark.parametrize("held", [1, 2], ids=["asking-the-repeat", "after-the-repeat"])
@pytest.mark.parametrize(("service", "first_call", "second_call"), [
    ("sales-assistant", tool_reply(("e1", "createEmailTask", MAIL)),
     tool_reply(("e2", "createEmailTask", MAIL_AGAIN))),
    ("sales-compact", as_text(json.dumps(MAIL)), as_text(MAIL_AGAIN)),
], ids=["calls", "calls-as-text"])
async def test_killed_at_a_repeated_email(turns: ProcessTurns, fake_llm: FakeOpenAIServer,
                                          service: str,
                                          first_call: ScriptedReply, second_call: ScriptedReply,
                                          held: int) -> None:
    """The model asks for the e-mail (approved), then for the identical
    e-mail. The worker dies while a model call is in flight: the one whose
    retry asks for the repeat (`held` 1: the next worker decides the repeat
    from the replayed first call), or the one after the repeat was settled
    (`held` 2: the next worker replays that decision). One e-mail, one
    approval, audit COMPLETED + REPEATED, the model told what the first
    call returned; completed."""
    hang = HangingReply()
    replies: list[ScriptedReply] = [first_call, second_call, text_reply("Queued the e-mail.")]
    fake_llm.script(*replies[:held], hang, *replies[held:])
    wf_id = f"kill-repeat-{service}-{held}-{turns.task_queue}"
    first = turns.worker("worker1")
    try:
        handle = await turns.start(wf_id, "mail ops", service=service)
        [pending] = await wait_pending(handle)
        await handle.signal("approve", ApproveSignal(tool_call_id=pending.tool_call_id,
                                                     reviewer="ops-lead"))
        await wait_until(hang.entered.is_set, timeout=30, what="the held model call")
        # Killed here: the e-mail (and, after the repeat, its settling) recorded.
        assert audit(turns, wf_id) == [("createEmailTask", "COMPLETED"),
                                       ("createEmailTask", "REPEATED")][:held]
    finally:
        first.kill()
    result = await resumed(turns, handle, hang)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "Queued the e-mail."
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED, CallStatus.REPEATED]
    assert all(c.name == "createEmailTask" for c in result.tool_calls)
    with turns.db.connect() as conn:
        mails = fetchall(conn, "SELECT task_id FROM email_task WHERE idempotency_key LIKE :k",
                         {"k": wf_id + "/%"})
        approvals = fetchall(conn, "SELECT tool_call_id FROM approval_decision "
                                   "WHERE workflow_id = :wf", {"wf": wf_id})
    assert len(mails) == 1
    assert [a["tool_call_id"] for a in approvals] == [pending.tool_call_id]
    assert audit(turns, wf_id) == [("createEmailTask", "COMPLETED"),
                                   ("createEmailTask", "REPEATED")]
    [(_, ran)] = await activity_runs(handle, EXECUTE_TOOL)  # the e-mail, once
    assert ran.activity_task_started_event_attributes.attempt == 1
    runs = await activity_runs(handle, CALL_MODEL)
    assert [s.activity_task_started_event_attributes.attempt for _, s in runs] == [
        2 if i == held else 1 for i in range(3)]
    after_heartbeat_timeout(*runs[held])
    requests = answered(fake_llm)
    assert len(requests) == 4  # the e-mail, the repeat, the answer; one of them twice
    assert requests[held]["messages"] == requests[held + 1]["messages"]
    told = tool_messages(requests[3])
    assert [m["tool_call_id"] for m in told] == [c.id for c in result.tool_calls]
    assert told[1]["content"].startswith("Not run again: createEmailTask already ran")
    assert mails[0]["task_id"] in told[1]["content"]
    assert not fake_llm.refusals
    await no_failed_workflow_tasks(handle)
    assert truth.disagreements(turns.db, f"c-{wf_id}") == []


async def test_killed_while_the_answer_after_repeats_is_asked(turns: ProcessTurns,
                                                             fake_llm: FakeOpenAIServer) -> None:
    """A model that repeats a reservation twice is asked for its answer
    without tools; the worker dies while that request is in flight. The
    retry asks the same (no tools, ANSWER_NOW); one reservation; completed."""
    hang = HangingReply()
    reserve = {"item": "chairs"}
    fake_llm.script(tool_reply(("r1", "reserve", reserve)), tool_reply(("r2", "reserve", reserve)),
                    tool_reply(("r3", "reserve", reserve)), hang,
                    text_reply("Reserved the chairs."))
    wf_id = f"kill-answer-now-{turns.task_queue}"
    first = turns.worker("worker1")
    try:
        handle = await turns.start(wf_id, "reserve chairs")
        await wait_until(hang.entered.is_set, timeout=30, what="the request for the answer")
        assert audit(turns, wf_id) == [("reserve", "COMPLETED"), ("reserve", "REPEATED"),
                                       ("reserve", "REPEATED")]
    finally:
        first.kill()
    result = await resumed(turns, handle, hang)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "Reserved the chairs."
    assert [(c.id, c.status) for c in result.tool_calls] == [
        ("r1", CallStatus.COMPLETED), ("r2", CallStatus.REPEATED), ("r3", CallStatus.REPEATED)]
    assert [r["note"] for r in side_effects(turns.db, wf_id)] == ["chairs"]
    assert audit(turns, wf_id) == [("reserve", "COMPLETED"), ("reserve", "REPEATED"),
                                   ("reserve", "REPEATED")]
    assert len(await activity_runs(handle, EXECUTE_TOOL)) == 1
    *_, (scheduled, started) = await activity_runs(handle, CALL_MODEL)
    after_heartbeat_timeout(scheduled, started)
    requests = answered(fake_llm)
    assert len(requests) == 5  # r1, r2, r3, the lost request for the answer, its retry
    for asked in requests[3:]:
        assert "tools" not in asked
        assert asked["messages"][-1] == {"role": "user", "content": ANSWER_NOW}
    assert requests[3]["messages"] == requests[4]["messages"]
    await no_failed_workflow_tasks(handle)


# --- the empty-answer re-ask ---------------------------------------------------

@pytest.mark.parametrize(("second", "status"), [("Reserved the hall.", TurnStatus.COMPLETED),
                                                ("  \n", TurnStatus.FAILED)],
                         ids=["answered", "empty-again"])
async def test_killed_during_the_empty_answer_reask(turns: ProcessTurns, fake_llm: FakeOpenAIServer,
                                                    second: str, status: TurnStatus) -> None:
    """After a reservation the model answers nothing; the worker dies while
    the re-ask (no tools, EMPTY_NUDGE) is in flight. The retried re-ask's
    answer ends the turn as it would have: completed with it, or, empty too,
    failed (EmptyAnswer) without a third request. One reservation."""
    hang = HangingReply()
    fake_llm.script(tool_reply(("r1", "reserve", {"item": "hall"})), text_reply(""), hang,
                    text_reply(second))
    wf_id = f"kill-reask-{turns.task_queue}"
    conv = f"c-{wf_id}"
    first = turns.worker("worker1")
    try:
        handle = await turns.start(wf_id, "reserve the hall")
        await wait_until(hang.entered.is_set, timeout=30, what="the re-ask")
        # Killed here: the empty answer is discarded, the re-ask is open.
        assert stored_assistant(turns, conv)[-1] == ("", "empty_answer")
    finally:
        first.kill()
    result = await resumed(turns, handle, hang)
    assert result.status == status, result.error
    assert [(c.id, c.status) for c in result.tool_calls] == [("r1", CallStatus.COMPLETED)]
    assert [r["note"] for r in side_effects(turns.db, wf_id)] == ["hall"]
    assert audit(turns, wf_id) == [("reserve", "COMPLETED")]
    requests = answered(fake_llm)
    # The reservation, the empty answer, the lost re-ask, its retry: the
    # re-ask is one activity (attempt 2), asked once more, not twice more.
    assert len(requests) == 4
    for reask in requests[2:]:
        assert "tools" not in reask
        assert reask["messages"][-1] == {"role": "user", "content": EMPTY_NUDGE}
    assert requests[2]["messages"] == requests[3]["messages"]
    runs = await activity_runs(handle, CALL_MODEL)
    assert [s.activity_task_started_event_attributes.attempt for _, s in runs] == [1, 1, 2]
    after_heartbeat_timeout(*runs[-1])
    [_, *answers] = stored_assistant(turns, conv)  # the first held the call
    if status is TurnStatus.COMPLETED:
        assert result.answer == second
        assert answers == [("", "empty_answer"), (second, None)]
    else:
        assert result.error is not None and result.error.type == "EmptyAnswer"
        assert answers == [("", "empty_answer"), (second, "empty_answer")]
    await no_failed_workflow_tasks(handle)


# --- the made-up-result re-ask (revision 9) ----------------------------------

MADE_UP = ('<tool_response>\n{"reservation": "R-1", "status": "CONFIRMED"}\n'
           "</tool_response>\nThe hall is reserved.")


@pytest.mark.parametrize(("second", "status"), [("Reserved the hall.", TurnStatus.COMPLETED),
                                                (MADE_UP, TurnStatus.FAILED)],
                         ids=["answered", "made-up-again"])
async def test_killed_during_the_made_up_result_reask(
        turns: ProcessTurns, fake_llm: FakeOpenAIServer, second: str,
        status: TurnStatus) -> None:
    """After a reservation the model answers with a tool result it wrote
    itself; the worker dies while the re-ask (no tools, FABRICATED_NUDGE) is in
    flight. The retried re-ask's answer ends the turn as it would have:
    completed with it, or, made up again, failed (FabricatedToolResult)
    without a third request. One reservation."""
    hang = HangingReply()
    fake_llm.script(tool_reply(("r1", "reserve", {"item": "hall"})), text_reply(MADE_UP), hang,
                    text_reply(second))
    wf_id = f"kill-made-up-{turns.task_queue}"
    conv = f"c-{wf_id}"
    first = turns.worker("worker1")
    try:
        handle = await turns.start(wf_id, "reserve the hall")
        await wait_until(hang.entered.is_set, timeout=30, what="the re-ask")
        # Killed here: the made-up answer is discarded, the re-ask is open.
        assert stored_assistant(turns, conv)[-1] == (MADE_UP, "fabricated_result")
    finally:
        first.kill()
    result = await resumed(turns, handle, hang)
    assert result.status == status, result.error
    assert [(c.id, c.status) for c in result.tool_calls] == [("r1", CallStatus.COMPLETED)]
    assert [r["note"] for r in side_effects(turns.db, wf_id)] == ["hall"]
    assert audit(turns, wf_id) == [("reserve", "COMPLETED")]
    requests = answered(fake_llm)
    assert len(requests) == 4  # the reservation, the made-up answer, the re-ask twice
    for reask in requests[2:]:
        assert "tools" not in reask
        assert reask["messages"][-1] == {"role": "user", "content": FABRICATED_NUDGE}
    assert requests[2]["messages"] == requests[3]["messages"]
    runs = await activity_runs(handle, CALL_MODEL)
    assert [s.activity_task_started_event_attributes.attempt for _, s in runs] == [1, 1, 2]
    after_heartbeat_timeout(*runs[-1])
    [_, *answers] = stored_assistant(turns, conv)  # the first held the call
    if status is TurnStatus.COMPLETED:
        assert result.answer == second
        assert answers == [(MADE_UP, "fabricated_result"), (second, None)]
    else:
        assert result.error is not None and result.error.type == "FabricatedToolResult"
        assert result.answer is None
        assert answers == [(MADE_UP, "fabricated_result")] * 2
    await no_failed_workflow_tasks(handle)


# --- calls written as text -----------------------------------------------------

async def test_killed_inside_a_call_written_as_text(turns: ProcessTurns, fake_llm: FakeOpenAIServer,
                                                    tmp_path: Path) -> None:
    """`test-text-calls` reads an answer that is only a call written as text
    as that call. journaledWrite (NOT idempotent; its row commits with the
    call's record) is killed after its INSERT, before the commit: the next
    worker runs it again, once; the model's text is read once."""
    wrote = tmp_path / "wrote"
    call = {"note": "once", "marker": str(wrote), "seconds": 60}
    fake_llm.script(
        text_reply(f'<tool_call>\n{{"name": "journaledWrite", "arguments": {json.dumps(call)}}}'
                   "\n</tool_call>"),
        text_reply("Wrote it."))
    wf_id = f"kill-text-call-{turns.task_queue}"
    side_effects(turns.db)  # the test tools' table, made before the journal's transaction
    first = turns.worker("worker1")
    try:
        handle = await turns.start(wf_id, "write it", service="test-text-calls")
        await wait_until(wrote.exists, timeout=30, what="the tool read from text never wrote")
        assert notes(turns.db, wf_id) == []  # written, not committed
    finally:
        first.kill()
    assert notes(turns.db, wf_id) == []
    result = await resumed(turns, handle)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "Wrote it."
    [ran] = result.tool_calls
    assert (ran.name, ran.status) == ("journaledWrite", CallStatus.COMPLETED)
    assert notes(turns.db, wf_id) == ["once"]
    assert ledger_status(turns.db, wf_id, ran.id) == "COMPLETED"
    assert audit(turns, wf_id) == [("journaledWrite", "COMPLETED")]
    [(scheduled, started)] = await activity_runs(handle, EXECUTE_TOOL)
    after_heartbeat_timeout(scheduled, started)
    requests = answered(fake_llm)
    assert len(requests) == 2  # the text was read once, not asked for again
    called, told = requests[1]["messages"][-2:]
    assert called["role"] == "assistant" and called["content"] == ""
    assert [(c["id"], c["function"]["name"]) for c in called["tool_calls"]] == [
        (ran.id, "journaledWrite")]
    assert told["tool_call_id"] == ran.id and '"attempt": 2' in told["content"]
    assert not fake_llm.refusals
    await no_failed_workflow_tasks(handle)
    assert truth.disagreements(turns.db, f"c-{wf_id}") == []
