"""A grant-covered turn reset, cancelled or terminated around its claim
(docs/approvals.md, "Standing approvals (grants)"): the sales service's
`createEmailTask`, a function model that mails the address the user names, a
real dev server and an in-process worker.

- Reset (`temporal workflow reset`, as the CLI does it) to the turn's first
  workflow task, to the task after the claim, and to the task after the
  mail: the new run claims the same grant again without a second use, the
  mail goes out once, the truth check is clean. SQLite and PostgreSQL.
- Cancel or terminate while the claim is in flight (its UPDATE held by a
  row lock another PostgreSQL session takes): the documented limit, shown as
  it is — the claim commits when the lock goes, so the grant counts a use
  that no call made, no mail goes out, and `check` reports the use without
  its audit row. PostgreSQL only: SQLite has no row lock to hold the claim
  with (a writer waiting on SQLite's file lock fails at its busy timeout).
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError

from tests.support.resets import reset_to, task_after
from tests.support.sql import fetchall
from tests.support.turns import running_worker
from tests.support.waiting import wait_until
from tests.test_execution_chain import _first_task_completed
from tests.test_grants import SALES, mailer
from turnstile.engine.activity_io import CLAIM_GRANT, EXECUTE_TOOL
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.grant_models import Equals, Grant, GrantScope
from turnstile.providers.function_model import FunctionModel
from turnstile.sales.service import build_sales_service
from turnstile.stores import grant_store, truth
from turnstile.stores.db import Database
from turnstile.stores.tables import stored_time

MESSAGE = "mail ops@example.com weekly numbers"


def ops_grant(uses: int = 3) -> Grant:
    now = datetime.now(UTC)
    return Grant(grant_id="g-ops", service=SALES, tool_name="createEmailTask",
                 scope=GrantScope.SERVICE, scope_key=SALES,
                 constraints={"to": Equals(value="ops@example.com")},
                 until=stored_time(now + timedelta(hours=1)), max_uses=uses, issued_by="bob",
                 issued_at=stored_time(now))


def mails(db: Database) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, "SELECT recipient FROM email_task")


@pytest.mark.parametrize("point", ["first task", "after the claim", "after the mail"])
async def test_a_reset_covered_turn_claims_the_same_use_and_mails_once(
        client: Client, task_queue: str, db: Database, point: str) -> None:
    grant_store.issue(db, ops_grant(), chain="")
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              provider=FunctionModel(mailer)) as turns:
        handle = await turns.start(MESSAGE, service=SALES, conversation="c-reset")
        first = await handle.result()
        assert first.status is TurnStatus.COMPLETED, first.error
        run = handle.result_run_id
        assert run is not None
        event = {"first task": lambda: _first_task_completed(client, handle.id, run),
                 "after the claim": lambda: task_after(client, handle.id, run, CLAIM_GRANT),
                 "after the mail": lambda: task_after(client, handle.id, run, EXECUTE_TOOL),
                 }[point]
        again = await reset_to(client, handle.id, run, await event())
        result = await again.result()
    assert result.status is TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED]
    assert grant_store.get(db, "g-ops").uses == 1
    with db.connect() as conn:
        uses = fetchall(conn, "SELECT tool_call_id FROM grant_use")
    assert len(uses) == 1
    assert mails(db) == [{"recipient": "ops@example.com"}]
    assert truth.grant_disagreements_of(db) == []


class HeldGrantRow:
    """Another PostgreSQL session holds the grant's row (`FOR UPDATE`) until
    released: a claim's UPDATE of its use count waits behind it."""

    def __init__(self, db: Database, grant_id: str) -> None:
        self.db, self.grant_id = db, grant_id
        self.held, self.release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        with self.db.engine.connect() as conn, conn.begin():
            conn.execute(sa.text("SELECT uses FROM approval_grant WHERE grant_id = :g "
                                 "FOR UPDATE"), {"g": self.grant_id})
            self.held.set()
            self.release.wait(30)

    def __enter__(self) -> HeldGrantRow:
        self._thread.start()
        assert self.held.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._thread.join(30)

    def claim_waiting(self) -> bool:
        """A session waits for a lock (the claim's UPDATE)."""
        with self.db.engine.connect() as conn:
            return bool(conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()")).scalar())


@pytest.mark.parametrize("ending", ["cancel", "terminate"])
async def test_a_turn_ended_while_its_claim_waits_counts_the_use_and_check_reports_it(
        client: Client, task_queue: str, db: Database, ending: str) -> None:
    if db.dialect != "postgresql":
        pytest.skip("a row lock holds the claim only on PostgreSQL (see the module's doc)")
    grant_store.issue(db, ops_grant(), chain="")
    async with running_worker(client, task_queue, db.url, [build_sales_service()],
                              provider=FunctionModel(mailer)) as turns:
        with HeldGrantRow(db, "g-ops") as row:
            handle = await turns.start(MESSAGE, service=SALES, conversation="c-held")
            await wait_until(row.claim_waiting, timeout=20, what="the claim waiting on the row")
            if ending == "cancel":
                await handle.cancel()
            else:
                await handle.terminate("operator gave up")
            await asyncio.sleep(0.5)  # the ending lands while the claim still waits
        # The lock is gone: the claim commits, for a turn that has ended.
        await wait_until(lambda: grant_store.get(db, "g-ops").uses == 1, timeout=20,
                         what="the held claim committing")
        if ending == "cancel":
            with pytest.raises(WorkflowFailureError) as err:
                await handle.result()
            assert isinstance(err.value.cause, CancelledError)
        nxt = await turns.run("mail ops@example.com after the end", service=SALES,
                              conversation="c-held")
    assert nxt.status is TurnStatus.COMPLETED, nxt.error
    assert mails(db) == [{"recipient": "ops@example.com"}]  # the next turn's, covered too
    assert grant_store.get(db, "g-ops").uses == 2
    with db.connect() as conn:
        audit = fetchall(conn, "SELECT grant_id, status, error_message FROM tool_execution_log "
                               "WHERE workflow_id = :w", {"w": handle.id})
    # The ended turn ran no call: its row says so, and names no grant.
    [row] = audit
    assert row["status"] == "FAILED" and row["grant_id"] is None
    assert ("Not run: the turn was cancelled before this call" if ending == "cancel"
            else "ended without a result (terminated") in row["error_message"]
    found = [f for f in truth.grant_disagreements_of(db) if handle.id in f]
    assert len(found) == 1 and "has no audit row naming it" in found[0], found
