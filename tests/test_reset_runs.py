"""`temporal workflow reset` in the middle of a turn: the reset run
is the turn's current run. It keeps the conversation's lock, sees the
conversation as of its reset point (what the base run wrote later is
superseded: kept, marked, never sent to the model), reuses the effects of
calls it makes again, flags those of superseded calls it does not, and no
other run interleaves. Through the real dev server and worker, on SQLite and
PostgreSQL; then the claim rules themselves, on both databases."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from tests.support.resets import lock_of, reset_to, task_after
from tests.support.services import make_service, side_effects
from tests.support.sql import fetchall
from tests.support.turns import running_worker, wait_pending
from tests.support.waiting import wait_until
from tests.test_execution_chain import _first_task_completed
from tests.test_exit_paths import stored_pairing
from turnstile.activities.run_writes import as_current_run, holder_gone
from turnstile.cli import starter
from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import EXECUTE_TOOL
from turnstile.engine.contract import ApproveSignal, AuditStatus, CallStatus, TurnStatus
from turnstile.engine.errors import MemoryConflictError, ResetConflict, RunSuperseded
from turnstile.engine.messages import Attachment, ChatMessage, ToolCall
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.stores.journal import CallJournal, Ending
from turnstile.stores.ledger import LedgerRow, LedgerStatus
from turnstile.stores.lock import Holder
from turnstile.stores.memory import MemoryStore
from turnstile.stores.runs import RunUnconfirmed, Writer, write
from turnstile.stores.superseded import (
    Effect,
    call_identity,
    effect_of,
    superseded_messages,
)
from turnstile.stores.transaction import Transaction
from turnstile.stores.truth import disagreements, notes
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


async def late_write(client: Client, db: Database, conv: str, wf_id: str, run_id: str) -> str:
    """A memory write by an activity of `run_id` after its run ended (as one
    of a reset base run's activities finishing late): refused, nothing written."""
    env = ActivityEnvironment(client=client)
    env.info = dataclasses.replace(env.info, workflow_id=wf_id, workflow_run_id=run_id)
    before = MemoryStore(db).snapshot(conv, "alice")
    with pytest.raises(RunSuperseded) as refused:
        await env.run(as_current_run, db, run_id, lambda w: write(
            db, conv, before.next_seq, [ChatMessage(role="assistant", content="late")], w))
    assert MemoryStore(db).snapshot(conv, "alice") == before
    return str(refused.value)


def sent_call_ids(request: dict[str, Any]) -> set[str]:
    """Every tool call id a model request carries (calls and results)."""
    ids = {m["tool_call_id"] for m in request["messages"] if m["role"] == "tool"}
    return ids | {c["id"] for m in request["messages"] for c in m.get("tool_calls") or []}


async def test_reset_after_a_tool_call_takes_another_path(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    conv = f"c-reset-b-{uuid.uuid4().hex[:6]}"
    pay = ("call_3", "sendMoneySlowly", {"to": "bob", "amount": 5})
    fake_llm.script(
        # The base run: a reservation, then two more calls, then a payment it waits on.
        tool_reply(("call_0", "reserve", {"item": "table"})),
        tool_reply(("call_1", "reserve", {"item": "chairs"}),
                   ("call_2", "slowUpsert", {"note": "lamp", "seconds": 0})),
        tool_reply(pay),
        # The reset run (reset to just after call_0): the same call_1, a
        # different call under the id call_2, then the same payment.
        tool_reply(("call_1", "reserve", {"item": "chairs"}), ("call_2", "add", {"a": 1, "b": 2})),
        tool_reply(pay),
        text_reply("table and chairs reserved, bob paid"),
        text_reply("all done"))  # the next turn of the conversation
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        base = await turns.start("reserve and pay", conversation=conv)
        await wait_pending(base)
        first_run = base.first_execution_run_id or ""
        point = await task_after(client, base.id, first_run, EXECUTE_TOOL)
        after = await reset_to(client, base.id, first_run, point)
        [pending] = await wait_pending(after)
        held = lock_of(db, conv)
        # The turn's chain runs: its lock is not taken over, whichever of its
        # runs the lock names (the base run's, or a lock taken before 0006).
        assert not await holder_gone(client, Holder(base.id, first_run, first_run))
        assert await holder_gone(client, Holder(base.id, first_run, None))
        # Another turn of the conversation waits for the reset run.
        other = await turns.start("and then?", conversation=conv)

        async def busy() -> bool:  # told the conversation is busy, once at least
            events = (await other.query("status"))["events"]
            return any(e["step"] == "conversation_busy" for e in events)

        await wait_until(busy, what="the other turn found the conversation busy")
        other_waits = (await other.query("status"))["step"] == "queued" and len(
            fake_llm.requests) == 5
        await after.signal("approve", ApproveSignal(tool_call_id=pending.tool_call_id,
                                                    reviewer="carol"))
        reset_result = await after.result()
        other_result = await other.result()
        gone = await holder_gone(client, Holder(base.id, after.run_id, first_run))
        late = await late_write(client, db, conv, base.id, first_run)  # an activity of the base run
        released = lock_of(db, conv)
        kept = superseded_messages(db, conv)
        stored = MemoryStore(db).messages(conv)
        violations = stored_pairing(db, conv)
        audit = AuditLog(db).rows(base.id)
        truth, flagged = disagreements(db, conv), notes(db, conv)
        monkeypatch.setenv("DATABASE_URL", db.url)
        capsys.readouterr()
        check = await starter.main(["check", "--conversation", conv])
        printed = capsys.readouterr().out
    assert reset_result.status == TurnStatus.COMPLETED, reset_result.error
    assert other_result.status == TurnStatus.COMPLETED, other_result.error
    assert (reset_result.answer, other_result.answer) == (
        "table and chairs reserved, bob paid", "all done")
    assert "_refused" not in str(fake_llm.requests)  # the strict model accepted every request

    # The lock: the turn's chain, in the reset run's name; then the next turn's; then free.
    assert held == {"workflow_id": base.id, "execution_chain": first_run,
                    "run_id": after.run_id}
    assert other_waits and gone and released is None
    assert late.startswith(f"run {first_run} of turn {base.id} is no longer")

    # What the reset run's model read: the conversation as of the reset point
    # (call_0 and its result), then its own calls; nothing of the base run's later rows.
    renamed = "call_2~4.1"  # call_2 was another call in the base run
    reset_requests = fake_llm.requests[3:6]
    assert [m["role"] for m in reset_requests[0]["messages"]] == [
        "system", "user", "assistant", "tool"]
    assert [sent_call_ids(r) for r in reset_requests] == [
        {"call_0"}, {"call_0", "call_1", renamed}, {"call_0", "call_1", renamed, "call_3"}]
    assert "slowUpsert" not in json.dumps([r["messages"] for r in reset_requests])

    # Memory: one answer per call, the renamed call got its own result.
    results = {m.tool_call_id: m for m in stored if m.role == "tool"}
    assert set(results) == {"call_0", "call_1", renamed, "call_3"} and violations == []
    assert json.loads(results[renamed].content or "") == {"sum": 3}
    assert json.loads(results["call_1"].content or "") == {"reserved": "chairs"}

    # Kept for the record: the base run's rows from the reset point on,
    # marked with the run that superseded them.
    assert [(k.seq, k.message.role, k.message.tool_call_id) for k in kept] == [
        (4, "assistant", None), (5, "tool", "call_1"), (6, "tool", "call_2"),
        (7, "assistant", None), (7, "tool", "call_3")]
    assert {(k.run_id, k.superseded_by) for k in kept[:4]} == {(first_run, after.run_id)}
    assert all(k.superseded_at for k in kept)
    effects = {k.message.tool_call_id: k.message.attributes[attr.SUPERSEDED_EFFECT]["effect"]
               for k in kept if k.message.role == "tool"}
    assert effects == {"call_1": "made_again", "call_2": "remains", "call_3": "made_again"}

    # The world: every effect once; the base run's slowUpsert remains, flagged.
    assert sorted((e["tool"], e["note"]) for e in side_effects(db, base.id)) == [
        ("reserve", "chairs"), ("reserve", "table"), ("sendMoney", "bob:5"),
        ("slowUpsert", "lamp")]
    superseded_rows = [(r.tool_name, r.execution_id) for r in audit
                       if r.status == "SUPERSEDED"]
    assert superseded_rows == [("slowUpsert", f"{base.id}/{first_run}/call_2/superseded")]
    assert all(r.status != "INITIATED" for r in audit)

    # The truth check agrees and tells a person about the remaining effect.
    assert truth == [] and check == 0
    assert len(flagged) == 1 and "call_2 (slowUpsert)" in flagged[0]
    assert f"note: {flagged[0]}" in printed and printed.strip().endswith("0 disagreement(s)")


async def test_a_reset_of_a_turn_the_conversation_moved_on_from_changes_nothing(
        client: Client, task_queue: str, db: Database, fake_llm: FakeOpenAIServer) -> None:
    conv = f"c-reset-old-{uuid.uuid4().hex[:6]}"
    fake_llm.script(tool_reply(("call_0", "reserve", {"item": "table"})),
                    text_reply("table reserved"), text_reply("nothing else"),
                    text_reply("still the table"))
    async with running_worker(client, task_queue, db.url, [make_service()],
                              llm_url=fake_llm.url) as turns:
        old = await turns.start("reserve a table", conversation=conv)
        assert (await old.result()).status == TurnStatus.COMPLETED
        assert (await turns.run("anything else?", conversation=conv)).status == \
            TurnStatus.COMPLETED
        before = [(m.role, m.content) for m in MemoryStore(db).messages(conv)]
        run = old.result_run_id or ""
        after = await reset_to(client, old.id, run,
                               await task_after(client, old.id, run, EXECUTE_TOOL))
        refused = await after.result()
        # To the turn's first task: refused when it loads memory, the lock let go.
        again = await reset_to(client, old.id, run,
                               await _first_task_completed(client, old.id, run))
        refused_again, lock = await again.result(), lock_of(db, conv)
        kept = superseded_messages(db, conv)
        now = [(m.role, m.content) for m in MemoryStore(db).messages(conv)]
        nxt = await turns.run("what is reserved?", conversation=conv)
        truth = disagreements(db, conv)
    assert refused.status == TurnStatus.FAILED and refused.error is not None
    assert refused.error.type == "ResetConflict" and "went on after turn" in refused.error.message
    assert refused_again.status == TurnStatus.REFUSED and refused_again.error is not None
    assert refused_again.error.type == "ResetConflict" and lock is None
    # Nothing superseded, nothing rolled back: the reservation stands.
    assert kept == [] and now == before
    assert [e["note"] for e in side_effects(db, old.id)] == ["table"]
    assert [c.status for c in refused.tool_calls] == ["completed"]
    assert nxt.status == TurnStatus.COMPLETED and truth == []
    assert len(fake_llm.requests) == 4  # the refused reset run never asked the model


# --- the claim rules, on both databases ----------------------------------------
WF, CHAIN = "turn-r", "run-a"
A, B = Writer(WF, CHAIN, "run-a", confirmed=True), Writer(WF, CHAIN, "run-b")


def _msg(text: str, role: str = "user") -> ChatMessage:
    return ChatMessage(role=role, content=text)


def _lock(db: Database, conv: str, wf: str, run: str) -> None:
    """`wf`'s run `run` holds the conversation (whoever held it before)."""
    with db.connect() as conn:
        conn.execute("DELETE FROM conversation_lock WHERE conversation_id = :c", {"c": conv})
        conn.execute("INSERT INTO conversation_lock (conversation_id, workflow_id, run_id, "
                     "acquired_at, execution_chain) VALUES (:c, :wf, :run, 'now', :chain)",
                     {"c": conv, "wf": wf, "run": run, "chain": CHAIN})


def _live(db: Database, conv: str) -> list[tuple[int, str | None, str | None]]:
    with db.connect() as conn:
        return [(r["seq"], r["content"], r["run_id"]) for r in fetchall(conn,
            "SELECT seq, content, run_id FROM chat_message WHERE conversation_id = :c "
            "ORDER BY seq", {"c": conv})]


def test_a_new_run_takes_the_place_of_the_run_it_replaces(db: Database) -> None:
    conv = f"c-claim-{uuid.uuid4().hex[:6]}"
    MemoryStore(db).check_owner(conv, "alice")
    _lock(db, conv, WF, A.run_id)
    write(db, conv, 0, [_msg("sys", "system"), _msg("hi")], A)
    write(db, conv, 2, [ChatMessage(role="assistant", tool_calls=[
        ToolCall(id="c1", name="t"), ToolCall(id="c2", name="t")])], A)
    write(db, conv, 3, [_msg("r1", "tool"), _msg("r2", "tool")], A)
    write(db, conv, 5, [_msg("a's answer", "assistant")], A)
    # The reset run re-runs call c1 (slot 3); c2's result (slot 4) was
    # written before the reset point and stays; A's answer is not read yet.
    with pytest.raises(RunUnconfirmed):
        write(db, conv, 3, [_msg("r1 again", "tool")], B)
    assert _live(db, conv)[3] == (3, "r1", "run-a")  # nothing changed
    confirmed = Writer(WF, CHAIN, "run-b", confirmed=True)
    write(db, conv, 3, [_msg("r1 again", "tool")], confirmed)
    assert [c for _, c, _ in _live(db, conv)] == ["sys", "hi", None, "r1 again", "r2",
                                                  "a's answer"]
    # Its model call sweeps from its slot on: A's answer is superseded.
    write(db, conv, 5, [], confirmed, horizon=5)
    assert [s for s, _, _ in _live(db, conv)] == [0, 1, 2, 3, 4]
    kept = superseded_messages(db, conv)
    assert [(k.seq, k.message.content, k.run_id, k.superseded_by) for k in kept] == [
        (3, "r1", "run-a", "run-b"), (5, "a's answer", "run-a", "run-b")]
    assert lock_of(db, conv) == {"workflow_id": WF, "execution_chain": CHAIN, "run_id": "run-b"}
    # A late write of the replaced run asks to be confirmed (and is refused
    # by activities.run_writes: its run is not current).
    with pytest.raises(RunUnconfirmed):
        write(db, conv, 5, [_msg("late", "assistant")], Writer(WF, CHAIN, "run-a"))
    assert MemoryStore(db).snapshot(conv, "alice").next_seq == 5


def test_a_claim_to_confirm_keeps_the_journal_transaction(db: Database) -> None:
    """A transactional tool's effect waits in the call journal's transaction
    while the run is confirmed: recorded with it once confirmed; rolled back
    with it when the run is the one a reset replaced."""
    conv = f"c-tx-{uuid.uuid4().hex[:6]}"
    MemoryStore(db).check_owner(conv, "alice")
    _lock(db, conv, WF, A.run_id)
    call = ToolCall(id="c1", name="journaledWrite")
    write(db, conv, 0, [_msg("hi"), ChatMessage(role="assistant", tool_calls=[call])], A)
    write(db, conv, 2, [_msg("a's result", "tool")], A)  # written after the reset point
    journal = CallJournal(db, MemoryStore(db))
    with db.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS test_side_effect ("
                     "call_key TEXT NOT NULL, tool TEXT NOT NULL, note TEXT)")

    def attempt(run: str) -> tuple[Transaction, Ending]:
        tx = journal.transaction()
        with tx.use() as conn:  # the tool's effect
            conn.execute("INSERT INTO test_side_effect (call_key, tool, note) VALUES "
                         "(:k, 'journaledWrite', :run)", {"k": conv, "run": run})
        return tx, Ending(workflow_id=WF, chain=CHAIN, conversation_id=conv, user_id="alice",
                          call=call, seq=2, outcome=CallStatus.COMPLETED,
                          text=f"{run}'s result", is_error=False,
                          audit_status=AuditStatus.COMPLETED)

    tx, ending = attempt("run-b")
    with pytest.raises(RunUnconfirmed):
        journal.finish(ending, tx, B)
    journal.finish(ending, tx, dataclasses.replace(B, confirmed=True))
    late_tx, late = attempt("run-a")  # the replaced run's attempt, finishing late
    with pytest.raises(RunUnconfirmed):  # activities.run_writes: not current, RunSuperseded
        journal.finish(late, late_tx, Writer(WF, CHAIN, "run-a"))
    late_tx.release()
    with db.connect() as conn:
        effects = [r["note"] for r in fetchall(conn,
            "SELECT note FROM test_side_effect WHERE call_key = :k", {"k": conv})]
    assert effects == ["run-b"]
    assert [c for _, c, _ in _live(db, conv)] == ["hi", None, "run-b's result"]
    assert [k.message.content for k in superseded_messages(db, conv)] == ["a's result"]


def test_images_go_with_a_superseded_message(db: Database) -> None:
    conv = f"c-parts-{uuid.uuid4().hex[:6]}"
    MemoryStore(db).check_owner(conv, "alice")
    _lock(db, conv, WF, A.run_id)
    png = Attachment(type="image_url", url="https://example.com/a.png")
    write(db, conv, 0, [ChatMessage(role="user", content="look", parts=[png])], A)
    jpg = Attachment(type="image_url", url="https://example.com/b.jpg")
    write(db, conv, 0, [ChatMessage(role="user", content="look again", parts=[jpg])],
          Writer(WF, CHAIN, "run-b", confirmed=True), horizon=0)
    [now] = MemoryStore(db).messages(conv)
    assert (now.content, [p.url for p in now.parts]) == ("look again", [jpg.url])
    with db.connect() as conn:
        [kept] = fetchall(conn, "SELECT parts FROM superseded_message WHERE conversation_id = :c",
                                {"c": conv})
    assert [p["url"] for p in json.loads(kept["parts"])] == [png.url]


def test_a_reset_the_conversation_moved_on_from_is_refused(db: Database) -> None:
    conv = f"c-moved-{uuid.uuid4().hex[:6]}"
    MemoryStore(db).check_owner(conv, "alice")
    write(db, conv, 0, [_msg("turn r"), _msg("answer", "assistant")], A)  # A held, released
    MemoryStore(db).append(conv, 2, [_msg("next turn")], "turn-next", "chain-next")
    confirmed = Writer(WF, CHAIN, "run-b", confirmed=True)
    with pytest.raises(ResetConflict, match="went on after turn turn-r"):
        write(db, conv, 0, [], confirmed, horizon=0)
    _lock(db, conv, "turn-next", "run-n")  # the next turn holds the conversation now
    with pytest.raises(ResetConflict, match="is held by turn turn-next"):
        write(db, conv, 0, [], confirmed, horizon=0)
    with pytest.raises(MemoryConflictError, match="must not interleave"):
        write(db, conv, 3, [_msg("a stray write", "assistant")], confirmed)
    assert [c for _, c, _ in _live(db, conv)] == ["turn r", "answer", "next turn"]
    assert superseded_messages(db, conv) == []


def _ledger(status: str, outcome: str | None, is_error: bool = False) -> LedgerRow:
    return LedgerRow(tool_name="t", status=LedgerStatus(status), attempts=1,
                     outcome=outcome and CallStatus(outcome), is_error=is_error)


@pytest.mark.parametrize("ledger,live,effect", [
    (_ledger("COMPLETED", "completed"), None, Effect.REMAINS),
    (_ledger("COMPLETED", "completed"), {attr.OUTCOME: "completed"}, Effect.MADE_AGAIN),
    # Made again, but rejected this time: the first run's effect still remains.
    (_ledger("COMPLETED", "completed"), {attr.OUTCOME: "rejected"}, Effect.REMAINS),
    (_ledger("STARTED", None), None, Effect.UNKNOWN),
    (_ledger("COMPLETED", "failed", is_error=True), None, Effect.NONE),
    (_ledger("COMPLETED", None, is_error=False), None, Effect.REMAINS),  # before `outcome`
    (None, None, Effect.NONE),
    (None, {attr.OUTCOME: "rejected"}, Effect.MADE_AGAIN),
])
def test_what_became_of_a_superseded_call(ledger: LedgerRow | None,
                                          live: dict[str, Any] | None, effect: Effect) -> None:
    assert effect_of(ledger, live) is effect


def test_a_call_is_the_same_call_by_its_tool_and_argument_values() -> None:
    assert call_identity("t", '{"a": 1, "b": [2]}') == call_identity("t", '{"b":[2],"a":1}')
    assert call_identity("t", '{"a": 1}') != call_identity("u", '{"a": 1}')
    assert call_identity("t", '{"a": 1}') != call_identity("t", '{"a": 2}')
    deep = "[" * 100_000 + "]" * 100_000  # too deep to decode: compared as text
    assert call_identity("t", deep) == call_identity("t", deep) != call_identity("t", "[]")
