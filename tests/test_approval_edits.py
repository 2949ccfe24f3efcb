"""Approvals that keep the tool's result, and approvals by condition
(docs/approvals.md, "Approve with edits" and "Approval by condition").

A small loans desk of the tests' own (not the sales app): `lendBook` always
asks a reviewer and is undone by a compensation; `borrowBook` asks only when
the member already has two books out (a condition that reads the database).
Real dev server, in-process worker, SQLite and PostgreSQL, a function model
and the strict scripted model server over HTTP.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from temporalio.client import Client

from tests.support.databases import BACKENDS, worker_database_url
from tests.support.turns import running_worker, wait_pending
from turnstile.cli.printing import describe_pending
from turnstile.client import TurnstileClient
from turnstile.engine.approvals import arguments_digest
from turnstile.engine.contract import (
    ApproveSignal,
    AuditStatus,
    CallStatus,
    RejectSignal,
    TurnStatus,
)
from turnstile.providers.function_model import FunctionModel, ModelCall, Reply, call
from turnstile.runtime.config import Settings
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolContext, ToolRegistry, Undo, tool
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

ROOT = Path(__file__).resolve().parents[1]
META = sa.MetaData()
loans = sa.Table(
    "edits_test_loan", META,
    sa.Column("loan_key", sa.String(300), primary_key=True),
    sa.Column("member_id", sa.String(20), nullable=False),
    sa.Column("book_id", sa.String(20), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
)


def _lend(ctx: ToolContext, member_id: str, book_id: str) -> dict[str, Any]:
    with ctx.transaction() as conn:
        conn.execute(sa.insert(loans).values(loan_key=ctx.idempotency_key, member_id=member_id,
                                             book_id=book_id, status="OUT"))
    return {"member_id": member_id, "book_id": book_id, "status": "OUT"}


@tool(transactional=True, requires_approval=True, review_fields=["member_id"])
def lendBook(ctx: ToolContext, member_id: str, book_id: str) -> dict[str, Any]:
    """Lend a book to a member; a librarian approves every loan."""
    return _lend(ctx, member_id, book_id)


def too_many_loans(ctx: ToolContext, args: Any) -> str | None:
    """Ask a librarian when the member already has two books out."""
    with ctx.db.connect() as conn:
        out = conn.execute(sa.select(sa.func.count()).select_from(loans).where(
            loans.c.member_id == args.member_id, loans.c.status == "OUT")).scalar()
    return f"member {args.member_id} already has {out} books out" if out >= 2 else None


@tool(transactional=True, approval=too_many_loans)
def borrowBook(ctx: ToolContext, member_id: str, book_id: str) -> dict[str, Any]:
    """Lend a book to a member; a librarian approves only past two loans."""
    return _lend(ctx, member_id, book_id)


def give_back(ctx: ToolContext, args: Any, result: Any) -> Undo:
    with ctx.transaction() as conn:
        conn.execute(sa.update(loans).where(loans.c.member_id == args.member_id,
                                            loans.c.book_id == args.book_id)
                     .values(status="RETURNED"))
    return Undo(f"{args.book_id} returned")


lendBook.compensation(give_back)


def librarian(request: ModelCall) -> Reply:
    """Lends B-7 to M-2, then reads the loan as the tool returned it (a dict)."""
    loan = request.result_of("lendBook")
    if loan is None:
        return call("lendBook", member_id="M-2", book_id="B-7")
    lent = loan.result
    said = f"Lent {lent['book_id']} to {lent['member_id']}"
    if loan.edits is not None:
        change = loan.edits.changes["member_id"]
        said += (f"; {loan.edits.reviewer} changed member_id from {change.before} "
                 f"to {change.after}")
    return said


def borrower(request: ModelCall) -> Reply:
    """Borrows the book the user names for the member the user names."""
    member, book = request.user_text.split()[:2]
    done = request.result_of("borrowBook")
    if done is None:
        return call("borrowBook", member_id=member, book_id=book)
    return f"{done.result['book_id']} is out to {done.result['member_id']}"


def desk() -> Service:
    return Service(name="loans", tools=ToolRegistry([lendBook, borrowBook]),
                   system_prompt="You run a library's loans desk.")


def loan_rows(db: Database) -> list[tuple[str, str, str]]:
    with db.connect() as conn:
        return sorted((r.member_id, r.book_id, r.status) for r in conn.execute(
            sa.select(loans)))


def prepared(url: str) -> Database:
    db = Database(url)
    META.create_all(db.engine)
    with db.connect() as conn:
        conn.execute(sa.delete(loans))
    return db


EDITED = {"member_id": "M-3", "book_id": "B-7"}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_edited_approval_keeps_the_tools_result(
        client: Client, task_queue: str, tmp_path: Path, backend: str,
        request: pytest.FixtureRequest) -> None:
    db = prepared(worker_database_url(backend, request, tmp_path))
    async with running_worker(client, task_queue, db.url, [desk()],
                              provider=FunctionModel(librarian)) as turns:
        handle = await turns.start("lend B-7 to M-2", service="loans", user="alice")
        [p] = await wait_pending(handle)
        assert p.arguments == {"member_id": "M-2", "book_id": "B-7"} and p.reason is None
        await handle.signal("approve", ApproveSignal(
            tool_call_id=p.tool_call_id, reviewer="librarian-bob", arguments=EDITED,
            arguments_digest=p.arguments_digest))
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    # The model read the tool's own dict, and the edit beside it.
    assert result.answer == ("Lent B-7 to M-3; librarian-bob changed member_id from M-2 "
                             "to M-3")
    [ran] = result.tool_calls
    assert ran.status == CallStatus.COMPLETED and not ran.rolled_back
    assert loan_rows(db) == [("M-3", "B-7", "OUT")]  # the edited effect, not undone
    # Memory keeps the tool's result as it returned it; the edit is an attribute.
    [stored] = [m for m in turns.rt.memory.messages("c-1") if m.role == "tool"]
    assert json.loads(stored.content or "") == {"member_id": "M-3", "book_id": "B-7",
                                                "status": "OUT"}
    assert stored.attributes["turnstile.edited"]["by"] == "librarian-bob"
    assert stored.attributes["turnstile.edited"]["changed"] == ["member_id"]


async def test_a_wire_model_reads_the_tools_json_and_a_separate_note(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    db = prepared(f"sqlite:///{tmp_path}/t.db")
    asked = {"member_id": "M-2", "book_id": "B-7"}
    fake_llm.script(tool_reply(("l1", "lendBook", asked)), text_reply("lent"))
    async with running_worker(client, task_queue, db.url, [desk()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("lend B-7 to M-2", service="loans", user="alice")
        [p] = await wait_pending(handle)
        await handle.signal("approve", ApproveSignal(
            tool_call_id="l1", reviewer="bob", arguments=EDITED,
            arguments_digest=arguments_digest(asked)))
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    messages = fake_llm.requests[1]["messages"]  # accepted by the strict server
    [i] = [n for n, m in enumerate(messages) if m["role"] == "tool"]
    assert json.loads(messages[i]["content"]) == {**EDITED, "status": "OUT"}
    note = messages[i + 1]
    assert note["role"] == "user"
    assert "'bob' edited the arguments of your call l1 (lendBook)" in note["content"]
    assert "member_id: 'M-2' -> 'M-3'" in note["content"]
    assert loan_rows(db) == [("M-3", "B-7", "OUT")]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_approval_by_condition_waits_only_when_it_holds(
        client: Client, task_queue: str, tmp_path: Path, backend: str,
        request: pytest.FixtureRequest) -> None:
    db = prepared(worker_database_url(backend, request, tmp_path))
    async with running_worker(client, task_queue, db.url, [desk()],
                              provider=FunctionModel(borrower)) as turns:
        # Below the condition: runs at once, no reviewer asked.
        for n, book in enumerate(["B-1", "B-2"]):
            done = await turns.run(f"M-1 {book}", service="loans", conversation=f"c-{n}")
            assert done.status == TurnStatus.COMPLETED, done.error
            assert done.answer == f"{book} is out to M-1"
        # M-1 now has two books out: the third call waits, saying why.
        handle = await turns.start("M-1 B-3", service="loans", conversation="c-3")
        [p] = await wait_pending(handle)
        assert p.reason == "member M-1 already has 2 books out"
        assert p.tool_name == "borrowBook" and p.validated
        assert "    why: member M-1 already has 2 books out" in describe_pending(p)
        # What the inbox shows for the call (its detail page reads this view).
        view = await TurnstileClient(client, Settings.from_env(
            {"TURNSTILE_TASK_QUEUE": task_queue})).pending_approval(handle.id, p.tool_call_id)
        assert view is not None and view.reason == p.reason
        assert loan_rows(db) == [("M-1", "B-1", "OUT"), ("M-1", "B-2", "OUT")]
        # Another member's call does not wait meanwhile.
        other = await turns.run("M-9 B-4", service="loans", conversation="c-4")
        assert other.status == TurnStatus.COMPLETED, other.error
        await handle.signal("approve", ApproveSignal(
            tool_call_id=p.tool_call_id, reviewer="bob", arguments_digest=p.arguments_digest))
        result = await handle.result()
        assert result.status == TurnStatus.COMPLETED, result.error
        # A fourth waits too, and the reviewer rejects it.
        refused = await turns.start("M-1 B-5", service="loans", conversation="c-5")
        [q] = await wait_pending(refused)
        assert q.reason == "member M-1 already has 3 books out"
        await refused.signal("reject", RejectSignal(
            tool_call_id=q.tool_call_id, reviewer="bob", reason="three is enough",
            arguments_digest=q.arguments_digest))
        await refused.result()
    assert ("M-1", "B-3", "OUT") in loan_rows(db)
    assert ("M-1", "B-5", "OUT") not in loan_rows(db)
    # The audit row of each call says why it waited; the calls that did not wait say nothing.
    audit = AuditLog(db)
    waited = audit.rows(handle.id) + audit.rows(refused.id)
    assert [(r.tool_name, r.status, r.approval_reason) for r in waited] == [
        ("borrowBook", AuditStatus.COMPLETED, "member M-1 already has 2 books out"),
        ("borrowBook", AuditStatus.FAILED, "member M-1 already has 3 books out")]
    assert "rejected" in (waited[1].error_message or "")
    assert [r.approval_reason for r in audit.rows(other.workflow_id)] == [None]
    # `starter.py audit` prints it, in its table and in JSON.
    shown = starter_audit(db, "--tool", "borrowBook", "--json")
    reasons = sorted((row["approval_reason"] or "") for row in map(json.loads, shown))
    assert reasons == ["", "", "", "member M-1 already has 2 books out",
                       "member M-1 already has 3 books out"]
    header, *lines = starter_audit(db, "--tool", "borrowBook")[1:]
    assert header.split()[-1] == "approval_reason"
    assert sum(line.endswith("already has 2 books out") for line in lines) == 1


def starter_audit(db: Database, *args: str) -> list[str]:
    """`starter.py audit` on `db`: its output lines."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), "audit", *args],
        env={**os.environ, "DATABASE_URL": db.url}, cwd=ROOT, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def broken_model(request: ModelCall) -> Reply:
    loan = request.result_of("borrowBook")
    if loan is None:
        return call("borrowBook", member_id="M-5", book_id="B-5")
    return str(loan.text["member_id"])  # type: ignore[index]  # the user's own bug


async def test_a_model_functions_error_names_the_users_code(
        client: Client, task_queue: str, tmp_path: Path) -> None:
    db = prepared(f"sqlite:///{tmp_path}/t.db")
    async with running_worker(client, task_queue, db.url, [desk()],
                              provider=FunctionModel(broken_model)) as turns:
        result = await turns.run("M-5 B-5", service="loans")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "ModelFunctionError"
    assert "broken_model raised TypeError" in result.error.message
    assert f"{Path(__file__).name}:" in result.error.message  # file and line of the bug
    assert 'loan.text["member_id"]' in result.error.message


@tool
def shelveBook(ctx: ToolContext, book_id: str) -> dict[str, Any]:  # noqa: N802
    """Put a book back on its shelf."""
    shelf = {"B-1": "north"}
    return {"book_id": book_id, "shelf": shelf[book_id]}  # the user's own bug: no B-9


def shelver(request: ModelCall) -> Reply:
    if request.result_of("shelveBook") is None:
        return call("shelveBook", book_id="B-9")
    return "shelved"


async def test_a_tool_functions_error_names_the_users_code_in_the_log(
        client: Client, task_queue: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A tool that raises (not a ToolExecutionError): the worker's log names
    the file, line and code of the user's own frame, with the traceback."""
    db = prepared(f"sqlite:///{tmp_path}/t.db")
    shelf = Service(name="shelf", tools=ToolRegistry([shelveBook]), system_prompt="Shelve books.")
    caplog.set_level(logging.WARNING, logger="turnstile.activities.tool_calls")
    async with running_worker(client, task_queue, db.url, [shelf],
                              provider=FunctionModel(shelver)) as turns:
        await turns.run("shelve B-9", service="shelf")
    [line] = [r for r in caplog.records
              if r.name == "turnstile.activities.tool_calls"
              and "raised KeyError" in r.getMessage()][:1]
    said = line.getMessage()
    assert f"{Path(__file__).name}:" in said and "in shelveBook" in said, said
    assert "shelf[book_id]" in said and line.exc_info is not None
