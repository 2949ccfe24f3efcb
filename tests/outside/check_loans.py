"""Run from the app's own folder, in an environment that only installed the
wheel: one turn of loans.py through turnstile.testing.TestStack, approved with
edits; prints one line per fact checked, `ok` last (exit 1 on a failure)."""

import asyncio
import sys
import tempfile
from pathlib import Path

import sqlalchemy as sa
from loans import app, loans
from temporalio.client import Client, WorkflowExecutionStatus

from turnstile.testing import TestStack


async def main() -> None:
    with tempfile.TemporaryDirectory() as data:
        async with TestStack(app, Path(data)) as stack:
            turn = await stack.start("Please lend B-1", user="alice")
            decision = await stack.approve(turn, "bob", arguments={"book": "B-2",
                                                                    "member": "m-1"})
            assert decision.arguments == {"book": "B-2", "member": "m-1"}, decision
            result = await turn.result()
            assert result.status == "completed", result.error
            assert result.answer == "Lent B-2 to m-1", result.answer
            print("turn: completed with the reviewer's edit")
            with stack.db.connect() as conn:
                rows = conn.execute(sa.select(loans.c.book, loans.c.member)).all()
            assert [tuple(r) for r in rows] == [("B-2", "m-1")], rows
            print("loan: recorded once, as edited")
            own = await Client.connect(stack.temporal_address)
            described = await own.get_workflow_handle(turn.id).describe()
            assert described.status == WorkflowExecutionStatus.COMPLETED, described.status
            print(f"temporal_address: {stack.temporal_address} holds the turn")
    print("ok")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as failed:
        sys.stderr.write(f"failed: {failed!r}\n")
        raise SystemExit(1) from None
