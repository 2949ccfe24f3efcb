"""The loans app's own tests, as its author writes them (copied as
test_loans.py into the app's folder by tests/test_package_install.py and run
there with plain `pytest`: only pytest-asyncio besides the package, no
settings file)."""

from pathlib import Path

import pytest
from loans import app

from turnstile.testing import TestStack


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
