"""The loans app's own tests, as its author writes them (copied as
test_loans.py into the app's folder by tests/test_package_install.py and run
there with plain `pytest`: only pytest-asyncio and the package's `testing`
extra besides the package, no settings file)."""

from pathlib import Path

import pytest
from loans import app

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
