"""The second app (examples/support_desk), tested the way its author would:
only `turnstile` and `turnstile.testing`, real turns (a Temporal dev server,
the worker serving just this app, SQLite, SMTP). One test puts the desk in
front of a model server on a socket (the test kit's scripted one,
turnstile.testing.FakeOpenAIServer, standing in for LLM_BASE_URL) to see its
`ModelSettings` in the requests."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from examples.support_desk import build_app
from examples.support_desk.tables import desk_order, desk_refund
from examples.support_desk.tools import lookupOrder
from turnstile.testing import (
    FakeOpenAIServer,
    ScriptedModel,
    TestStack,
    call,
    text_reply,
    tool_reply,
)


def orders(stack: TestStack) -> dict[str, str]:
    with stack.db.connect() as conn:
        return {r.order_id: r.status for r in conn.execute(sa.select(desk_order))}


def refunds(stack: TestStack) -> list[tuple[str, int, str]]:
    with stack.db.connect() as conn:
        return [(r.order_id, r.amount_cents, r.status) for r in conn.execute(
            sa.select(desk_refund).order_by(desk_refund.c.order_id))]


@pytest.fixture(scope="module")
async def desk(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TestStack]:
    # Its own embedded dev server: the kit as an author uses it, nothing of tests/support.
    app = build_app()
    async with TestStack(app, tmp_path_factory.mktemp("desk")) as stack:
        yield stack


@pytest.fixture
def seeded(desk: TestStack) -> TestStack:
    app = desk.apps[0]
    assert app.seed is not None
    app.seed(desk.db, None)
    with desk.db.connect() as conn:
        conn.execute(sa.delete(desk_refund))
    return desk


async def test_a_small_refund_needs_no_approval(seeded: TestStack) -> None:
    result = await seeded.run("Please refund order A-1001")
    assert result.status == "completed", result.error
    assert [c.name for c in result.tool_calls] == ["lookupOrder", "issueRefund"]
    assert "Refunded $25.00 for order A-1001" in str(result.answer)
    assert refunds(seeded) == [("A-1001", 2500, "PAID_OUT")]
    assert orders(seeded)["A-1001"] == "REFUNDED"


async def test_a_large_refund_waits_for_a_person(seeded: TestStack) -> None:
    turn = await seeded.start("Refund A-1002 please", user="alice")
    [waiting] = await seeded.pending(turn)
    assert (waiting.tool_name, waiting.arguments["amount_cents"]) == ("issueRefund", 48000)
    assert waiting.reason == "a refund of $480.00 is above $100.00"  # approval by condition
    assert refunds(seeded) == []  # nothing is paid before the decision
    decision = await seeded.approve(turn, "bob")
    assert decision.approved and decision.reviewer == "bob"
    result = await turn.result()
    assert result.status == "completed", result.error
    assert "Refunded $480.00 for order A-1002" in str(result.answer)
    assert refunds(seeded) == [("A-1002", 48000, "PAID_OUT")]


async def test_a_rejected_refund_pays_nothing(seeded: TestStack) -> None:
    result = await seeded.run("Refund A-1002", reject="bob")
    assert result.status == "completed", result.error
    assert "did not go through" in str(result.answer)
    assert refunds(seeded) == []
    assert orders(seeded)["A-1002"] == "PAID"


async def test_one_call_runs_a_turn_with_its_approval(seeded: TestStack) -> None:
    result = await seeded.run("Refund A-1002", approve="carol")
    assert result.status == "completed", result.error
    assert [c.name for c in result.tool_calls] == ["lookupOrder", "issueRefund"]
    memory = seeded.memory(result.conversation_id)
    assert [m.role for m in memory] == ["system", "user", "assistant", "tool", "assistant",
                                        "tool", "assistant"]


async def test_cancel_reverses_a_refund_already_paid(tmp_path: Path, seeded: TestStack) -> None:
    # A scripted model: refund the small order, then ask for the large one,
    # which waits for approval — and the turn is cancelled there.
    script = ScriptedModel([
        call("issueRefund", order_id="A-1001", amount_cents=2500),
        call("issueRefund", order_id="A-1002", amount_cents=48000),
        "done",
    ])
    async with TestStack(build_app(), tmp_path, model=script,
                         temporal_address=seeded_address(seeded)) as stack:
        assert stack.apps[0].seed is not None
        stack.apps[0].seed(stack.db, None)
        turn = await stack.start("refund both", conversation="c-cancel")
        await stack.pending(turn)
        assert refunds(stack) == [("A-1001", 2500, "PAID_OUT")]
        await stack.cancel(turn)
        assert refunds(stack) == [("A-1001", 2500, "REVERSED")]
        assert orders(stack) == {"A-1001": "PAID", "A-1002": "PAID"}
        results = [m for m in stack.memory("c-cancel") if m.role == "tool"]
        assert [m.is_error for m in results] == [True, True]
        assert "ROLLED BACK" in (results[0].content or "").upper()


async def test_the_model_settings_go_out_with_every_request(tmp_path: Path, seeded: TestStack,
                                                           fake_llm: FakeOpenAIServer) -> None:
    # A real model (LLM_BASE_URL) instead of the offline function model: the
    # desk's ModelSettings are in each request the server receives.
    fake_llm.script(tool_reply(("c1", "lookupOrder", {"order_id": "A-1001"})),
                    text_reply("Order A-1001 is paid: $25.00."))
    async with TestStack(build_app(), tmp_path, env={"LLM_BASE_URL": fake_llm.url},
                         temporal_address=seeded_address(seeded)) as stack:
        assert stack.apps[0].seed is not None
        stack.apps[0].seed(stack.db, None)
        result = await stack.run("What is the status of order A-1001?")
    assert result.status == "completed", result.error
    assert result.answer == "Order A-1001 is paid: $25.00."
    assert fake_llm.refusals == []
    assert len(fake_llm.requests) == 2  # the call, then the answer
    for request in fake_llm.requests:
        assert (request["max_tokens"], request["temperature"]) == (512, 0.2)
        assert request["tool_choice"] == "auto"
        # The worker's default dialect ("grammar") leaves OrderId's pattern
        # out (llama.cpp's servers take it); the tool itself declares it.
        sent = next(t["function"]["parameters"] for t in request["tools"]
                    if t["function"]["name"] == "lookupOrder")
        assert "pattern" not in sent["properties"]["order_id"]
        assert "pattern" in lookupOrder.spec.parameters["properties"]["order_id"]


def test_the_readme_shows_the_settings_as_the_desk_has_them() -> None:
    root = Path(__file__).resolve().parent.parent
    shown = re.search(r"<!-- example: examples/support_desk/app.py [^>]*-->\n```python\n(.*?)```",
                      (root / "README.md").read_text(), re.S)
    assert shown is not None, "the README lost the desk's model settings"
    source = (root / "examples" / "support_desk" / "app.py").read_text().splitlines()
    assert [line for line in shown.group(1).splitlines() if line not in source] == []


def seeded_address(stack: TestStack) -> str:
    """The module's dev server, reused (TestStack(temporal_address=...))."""
    assert stack.rt is not None
    return stack.rt.settings.temporal_address
