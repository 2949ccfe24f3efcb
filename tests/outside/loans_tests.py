"""The loans app's own tests, as its author writes them (copied as
test_loans.py into the app's folder by tests/test_package_install.py and run
there with plain `pytest`: only pytest-asyncio and the package's `testing`
extra besides the package, no settings file)."""

from pathlib import Path

import pytest
import sqlalchemy as sa
from loans import app, reservations

from turnstile import Equals, GrantRequest, GrantScope
from turnstile.testing import FakeOpenAIServer, TestStack, text_reply, tool_reply


@pytest.mark.asyncio
async def test_a_loan_waits_for_the_desk_and_runs_as_edited(tmp_path: Path) -> None:
    async with TestStack(app, tmp_path) as stack:
        turn = await stack.start("Please lend B-3")
        (waiting,) = await stack.pending(turn)
        assert waiting.tool_name == "lendBook"
        await stack.approve(turn, "bob", arguments={"book": "B-4", "member": "m-1"})
        result = await turn.result()
    assert result.status == "completed", result.error
    assert result.answer == "Lent B-4 to m-1"


@pytest.mark.asyncio
async def test_a_rejected_loan_lends_nothing(tmp_path: Path) -> None:
    async with TestStack(app, tmp_path) as stack:
        result = await stack.run("Please lend B-5", reject="bob")
    assert result.status == "completed", result.error
    assert str(result.answer).startswith("Not lent:"), result.answer


@pytest.mark.asyncio
async def test_the_desk_on_an_http_model(tmp_path: Path) -> None:
    # The model client the app runs with in production (LLM_BASE_URL), against
    # the kit's strict OpenAI-compatible server instead of a real endpoint.
    with FakeOpenAIServer() as server:
        server.script(tool_reply(("c1", "lendBook", {"book": "B-6", "member": "m-1"})),
                      text_reply("Lent B-6 to m-1"))
        async with TestStack(app, tmp_path, env={"LLM_BASE_URL": server.url}) as stack:
            result = await stack.run("Please lend B-6", approve="bob")
    assert result.status == "completed", result.error
    assert result.answer == "Lent B-6 to m-1"
    assert server.refusals == []
    first, second = server.requests
    assert "lendBook" in [t["function"]["name"] for t in first["tools"]]
    assert second["messages"][-1]["role"] == "tool"
    assert second["messages"][-1]["tool_call_id"] == "c1"


@pytest.mark.asyncio
async def test_a_notice_cannot_choose_who_gets_a_reservation(tmp_path: Path) -> None:
    # reserveBook refuses a member that came from untrusted content (the
    # notice is a tool's result); the member the user names is theirs.
    async with TestStack(app, tmp_path) as stack:
        obeyed = await stack.run("Reserve B-7 as the notice says")
        given = await stack.run("Reserve B-8 for m-2")
        with stack.db.connect() as conn:
            rows = conn.execute(sa.select(reservations.c.book, reservations.c.member)).all()
    assert obeyed.status == "completed", obeyed.error
    assert str(obeyed.answer).startswith("Not reserved: Not run: reserveBook refuses"), \
        obeyed.answer
    assert "m-666" in str(obeyed.answer) and "readNotice" in str(obeyed.answer)
    assert given.answer == "Reserved B-8 for m-2", given.answer
    assert [tuple(r) for r in rows] == [("B-8", "m-2")]


@pytest.mark.asyncio
async def test_the_directory_s_member_id_is_vouched_and_the_member_s_note_is_not(
        tmp_path: Path) -> None:
    # findMember declares trusted_values=("id",): the id the library sets may
    # choose who gets a reservation; the note beside it, which the member
    # writes, may not.
    async with TestStack(app, tmp_path) as stack:
        by_id = await stack.run("Reserve B-12 for Ada")
        by_note = await stack.run("Reserve B-13 as Ada's note says")
        with stack.db.connect() as conn:
            rows = conn.execute(sa.select(reservations.c.book, reservations.c.member)).all()
    assert by_id.answer == "Reserved B-12 for m-7", by_id.answer
    assert str(by_note.answer).startswith("Not reserved: Not run: reserveBook refuses"), \
        by_note.answer
    assert "m-666" in str(by_note.answer) and "findMember" in str(by_note.answer)
    assert [tuple(r) for r in rows] == [("B-12", "m-7")]


@pytest.mark.asyncio
async def test_a_standing_approval_lends_once_more_without_asking(tmp_path: Path) -> None:
    async with TestStack(app, tmp_path) as stack:
        first = await stack.start("Please lend B-9", conversation="c-regular")
        decision = await stack.approve(first, "bob", grant=GrantRequest(
            scope=GrantScope.CONVERSATION, uses=1, reason="a regular",
            constraints={"member": Equals(value="m-1")}))  # any book, this member
        assert decision.issued_grant
        assert (await first.result()).answer == "Lent B-9 to m-1"
        # Covered: nobody decides this one (run() would time out if it waited).
        again = await stack.run("Please lend B-10", conversation="c-regular", timeout=30)
        assert again.answer == "Lent B-10 to m-1", again.answer
        # The one use is spent: the next waits for a person again.
        third = await stack.start("Please lend B-11", conversation="c-regular")
        (waiting,) = await stack.pending(third)
        assert waiting.tool_name == "lendBook"
        await stack.reject(third, "bob", reason="enough")
        assert str((await third.result()).answer).startswith("Not lent:")
