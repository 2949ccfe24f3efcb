"""Property: whatever arrives as a decision, the turn reads it — a payload
that is no valid decision is refused, recorded in the status query and
audited (APPROVAL_REFUSED), the call stays pending, nothing fails the
workflow task, and a valid decision afterwards still decides the turn.

Hypothesis generates `approve`/`reject` signal payloads and `review` update
payloads of wrong types and shapes (any JSON, wrong field types, unknown
fields, bytes, two payloads, unknown signal names) and decisions that are
well formed but refused (the requester, a stale digest, edits that fail the
tool's schema or the allow-list, reject with edits). Each example is one
real turn on the dev server, on SQLite and PostgreSQL; EXAMPLES per
database (derandomized).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from tests.support.loop_thread import LoopThread, hosted_worker
from tests.support.sql import fetchall
from tests.support.temporal_server import DevServer
from tests.support.turns import Turns, wait_pending
from turnstile.engine.contract import ApproveSignal, TurnProgress, TurnStatus
from turnstile.sales.service import build_sales_service
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

EXAMPLES = 15
MAIL = {"to": "ops@example.com", "subject": "Renewal", "body": "Please renew."}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8)
FIELDS = ["tool_call_id", "reviewer", "comment", "reason", "note", "approved", "arguments",
          "arguments_digest", "argumnets", ""]
shaped = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5)
# Well formed, about the real call, and refused all the same.
REFUSED_ON_THE_CALL = [
    {"tool_call_id": "e1", "reviewer": "alice"},  # the requester
    {"tool_call_id": "e1", "reviewer": "ALICE\u200b"},  # ... respelled
    {"tool_call_id": "e1", "reviewer": "bob", "arguments_digest": "0" * 64},  # stale
    {"tool_call_id": "e1", "reviewer": "bob", "arguments": {"to": "ops@example.com"}},
    {"tool_call_id": "e1", "reviewer": "bob", "arguments": {**MAIL, "to": "x@attacker.test"}},
    {"tool_call_id": "e1", "reviewer": "bob", "arguments": {**MAIL, "to": 5}},
    {"tool_call_id": "e1", "reviewer": " "},  # nobody
]


@dataclass(frozen=True)
class Sent:
    door: str  # a signal's name, or "review" (the update)
    args: list[Any]  # its payloads


def _might_decide(value: Any) -> bool:
    return isinstance(value, dict) and value.get("tool_call_id") == "e1"


random_payload = st.one_of(json_values, shaped, st.binary(max_size=10)).filter(
    lambda v: not _might_decide(v))
signal_names = st.sampled_from(["approve", "reject"]) | st.sampled_from(
    ["aprove", "Approve", "status"]) | st.text(min_size=1, max_size=12)


@st.composite
def sent(draw: st.DrawFn) -> Sent:
    door = draw(st.sampled_from(["signal", "review", "two"]))
    if draw(st.booleans()):
        value: Any = draw(st.sampled_from(REFUSED_ON_THE_CALL))
        if door == "review":
            value = {**value, "approved": True}
        if door == "signal" and draw(st.booleans()):
            return Sent("reject", [{**value, **({"arguments": MAIL} if "arguments" not in value
                                                 else {})}])
        return Sent("review" if door == "review" else "approve", [value])
    if door == "two":
        return Sent(draw(st.sampled_from(["approve", "reject"])),
                    [draw(random_payload), draw(random_payload)])
    if door == "review":
        return Sent("review", [draw(random_payload)])
    return Sent(draw(signal_names), [draw(random_payload)])




@pytest.fixture
def parked(temporal_server: DevServer, db: Database,
           fake_llm: FakeOpenAIServer) -> Iterator[tuple[LoopThread, Turns]]:
    def reply(request: dict[str, Any]) -> dict[str, Any]:
        last = request["messages"][-1]["role"]
        return text_reply("done") if last == "tool" else tool_reply(
            ("e1", "createEmailTask", MAIL))

    fake_llm.default = reply
    with hosted_worker(temporal_server.address, f"dp-{uuid.uuid4().hex[:8]}", db.url,
                       [build_sales_service()], llm_url=fake_llm.url) as (lt, turns):
        yield lt, turns


async def _one(turns: Turns, db: Database, payloads: list[Sent]) -> None:
    key = f"dp-{uuid.uuid4().hex[:10]}"
    handle = await turns.start("mail ops", service="sales-assistant", user="alice",
                               conversation=key)
    await wait_pending(handle)
    for p in payloads:
        if p.door == "review":
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update("review", args=p.args)
            cause = refused.value.cause
            assert isinstance(cause, ApplicationError) and cause.type == "DecisionRefused"
        else:
            await handle.signal(p.door, args=p.args)
    for _ in range(200):  # every payload recorded and audited
        seen = await handle.query("status", result_type=TurnProgress)
        with db.connect() as conn:
            audited = fetchall(conn, "SELECT error_message FROM tool_execution_log WHERE "
                                     "workflow_id = :wf AND status = 'APPROVAL_REFUSED'",
                               {"wf": handle.id})
        if seen.refused_signals_total >= len(payloads) and len(audited) >= len(payloads):
            break
        await asyncio.sleep(0.05)
    assert seen.refused_signals_total == len(payloads) == len(audited), (seen, audited)
    assert all(row["error_message"] for row in audited)
    assert [p.tool_call_id for p in seen.pending_approvals] == ["e1"]  # still waiting
    await handle.signal("approve", ApproveSignal(tool_call_id="e1", reviewer="bob"))
    result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result
    history = await handle.fetch_history()
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in [e.event_type
                                                             for e in history.events]


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
def test_any_decision_payload_is_refused_recorded_and_the_turn_still_decidable(
        parked: tuple[LoopThread, Turns], db: Database) -> None:
    lt, turns = parked
    kinds: set[str] = set()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(payloads=st.lists(sent(), min_size=1, max_size=4))
    def one(payloads: list[Sent]) -> None:
        kinds.update(p.door for p in payloads)
        lt.run(_one(turns, db, payloads), timeout=90)

    one()
    assert {"approve", "reject", "review"} <= kinds, kinds  # every door was exercised
