"""Standing approvals (grants) through real turns (docs/approvals.md, "Standing
approvals (grants)"): the sales service's `createEmailTask`, a real dev
server and an in-process worker, on SQLite and PostgreSQL, a function model
that mails the address the user names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from tests import test_information_flow as flow_desk
from tests.support.databases import worker_database_url
from tests.support.sql import fetchall
from tests.support.turns import Turns, running_worker, wait_pending
from turnstile.cli import starter
from turnstile.client import ApprovalRefused, TurnstileClient
from turnstile.engine.contract import CallStatus, PendingApproval, TurnResult, TurnStatus
from turnstile.engine.grant_models import Equals, Grant, GrantRequest, GrantScope
from turnstile.providers.function_model import FunctionModel, ModelCall, Reply, call
from turnstile.runtime.services import Service
from turnstile.sales.service import build_sales_service
from turnstile.stores import grant_store, truth
from turnstile.stores.db import Database
from turnstile.stores.tables import stored_time

SALES = "sales-assistant"
TO_OPS = {"to": Equals(value="ops@example.com")}


def mailer(request: ModelCall) -> Reply:
    """Mails the address the user's message names: 'mail ADDRESS SUBJECT...'."""
    done = request.result_of("createEmailTask")
    if done is None:
        words = request.user_text.split()
        return call("createEmailTask", to=words[1], subject=" ".join(words[2:]) or "hello",
                    body="Please follow up.")
    return f"queued: {done.text[:60]}"


def twice(request: ModelCall) -> Reply:
    """Two mails to ops in one response."""
    if request.result_of("createEmailTask") is None:
        return [call("createEmailTask", to="ops@example.com", subject=f"part {i}",
                     body="Please follow up.") for i in (1, 2)]
    return "both queued"


async def start(turns: Turns, message: str, *, user: str = "alice",
                conversation: str = "c-g") -> WorkflowHandle[Any, TurnResult]:
    return await turns.start(message, service=SALES, user=user, conversation=conversation)


def audit_grants(db: Database) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, "SELECT workflow_id, tool_name, status, grant_id FROM "
                              "tool_execution_log WHERE tool_name = 'createEmailTask' "
                              "ORDER BY start_time")


async def issue(turns: Turns, client: TurnstileClient, grant: GrantRequest, *,
                reviewer: str = "bob", user: str = "alice") -> tuple[str, PendingApproval]:
    """A turn whose mail waits; `reviewer` approves it with `grant`."""
    handle = await start(turns, "mail ops@example.com weekly numbers", user=user)
    [pending] = await wait_pending(handle)
    taken = await client.review(handle.id, pending.tool_call_id, True, reviewer, grant=grant)
    assert taken.issued_grant, taken
    assert (await handle.result()).status is TurnStatus.COMPLETED
    return taken.issued_grant, pending


def service() -> Service:
    return build_sales_service()


async def test_a_grant_covers_two_turns_and_not_the_third(client: Client, task_queue: str,
                                                          db: Database) -> None:
    async with running_worker(client, task_queue, db.url, [service()],
                              provider=FunctionModel(mailer)) as turns:
        api = TurnstileClient(client, turns.rt.settings)
        grant_id, pending = await issue(turns, api, GrantRequest(
            scope=GrantScope.USER, uses=2, constraints=TO_OPS, reason="weekly numbers"))
        # What the reviewer was offered: the tool's ceiling, `to` and `subject` held equal.
        assert pending.grant_offer is not None
        assert pending.grant_offer.ceiling.max_uses == 100
        assert set(pending.grant_offer.constraints) == {"to", "subject"}
        covered = []
        for n in (1, 2):  # no reviewer: the grant approves them
            result = await turns.run(f"mail ops@example.com numbers {n}", service=SALES,
                                     conversation=f"c-g{n}")
            assert result.status is TurnStatus.COMPLETED, result.error
            assert result.tool_calls[0].status is CallStatus.COMPLETED
            covered.append(result.workflow_id)
        third = await start(turns, "mail ops@example.com numbers 3", conversation="c-g3")
        [waiting] = await wait_pending(third)  # the grant is used up: a reviewer decides
        assert [(c.grant_id, c.why_not) for c in waiting.grant_candidates] == [
            (grant_id, "all 2 uses taken")]
        await api.review(third.id, waiting.tool_call_id, False, "bob", "enough")
        await third.result()
        # Another recipient is never covered.
        other = await start(turns, "mail sales@example.com hi", conversation="c-g4")
        [elsewhere] = await wait_pending(other)
        await api.review(other.id, elsewhere.tool_call_id, False, "bob")
        await other.result()
    rows = audit_grants(db)
    assert [r["grant_id"] for r in rows if r["workflow_id"] in covered] == [grant_id] * 2
    assert [r["grant_id"] for r in rows if r["workflow_id"] not in covered] == [None] * 3
    [stored] = grant_store.listed(db, include_ended=True)
    assert (stored.uses, stored.max_uses, stored.issued_by) == (2, 2, "bob")
    assert grant_store.listed(db) == []  # used up: not live
    assert truth.grant_disagreements_of(db) == []


async def test_a_revoked_grant_covers_nothing(client: Client, task_queue: str,
                                              db: Database) -> None:
    async with running_worker(client, task_queue, db.url, [service()],
                              provider=FunctionModel(mailer)) as turns:
        api = TurnstileClient(client, turns.rt.settings)
        grant_id, _ = await issue(turns, api, GrantRequest(scope=GrantScope.SERVICE, uses=5,
                                                           constraints=TO_OPS))
        revoked = await api.revoke_grant(grant_id, "carol", "no more")
        assert revoked.revoked_by == "carol"
        handle = await start(turns, "mail ops@example.com after", conversation="c-r2")
        [waiting] = await wait_pending(handle)
        assert waiting.grant_candidates == []  # revoked grants are not offered
        await api.review(handle.id, waiting.tool_call_id, True, "bob")
        assert (await handle.result()).status is TurnStatus.COMPLETED
    assert [r["grant_id"] for r in audit_grants(db)] == [None, None]
    assert grant_store.get(db, grant_id).uses == 0


async def test_a_grant_issued_covers_the_turns_other_waiting_call(
        client: Client, task_queue: str, db: Database) -> None:
    async with running_worker(client, task_queue, db.url, [service()],
                              provider=FunctionModel(twice)) as turns:
        api = TurnstileClient(client, turns.rt.settings)
        handle = await start(turns, "mail ops twice")
        first, second = await wait_pending(handle, 2)
        taken = await api.review(handle.id, first.tool_call_id, True, "bob",
                                 grant=GrantRequest(uses=3, constraints=TO_OPS))
        result = await handle.result()
    assert result.status is TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 2
    by_call = {r["grant_id"] for r in audit_grants(db)}
    assert by_call == {None, taken.issued_grant}
    assert grant_store.get(db, str(taken.issued_grant)).uses == 1


async def test_self_grants_and_grants_beyond_the_ceiling_are_refused(
        client: Client, task_queue: str, db: Database) -> None:
    async with running_worker(client, task_queue, db.url, [service()],
                              provider=FunctionModel(mailer)) as turns:
        api = TurnstileClient(client, turns.rt.settings)
        handle = await start(turns, "mail ops@example.com mine")
        [pending] = await wait_pending(handle)
        with pytest.raises(ApprovalRefused, match="requested this call"):
            await api.review(handle.id, pending.tool_call_id, True, "alice",
                             grant=GrantRequest(scope=GrantScope.SERVICE, uses=2))
        with pytest.raises(ApprovalRefused, match="beyond createEmailTask's ceiling of 100"):
            await api.review(handle.id, pending.tool_call_id, True, "bob",
                             grant=GrantRequest(uses=1000))
        with pytest.raises(ApprovalRefused, match="must stay fixed|would not cover"):
            await api.review(handle.id, pending.tool_call_id, True, "bob", grant=GrantRequest(
                constraints={"to": Equals(value="sales@example.com")}))
        # bob grants for the whole service; bob's own mail is not covered by it.
        taken = await api.review(handle.id, pending.tool_call_id, True, "bob",
                                 grant=GrantRequest(scope=GrantScope.SERVICE, uses=5,
                                                    constraints=TO_OPS))
        await handle.result()
        own = await start(turns, "mail ops@example.com bobs", user="bob", conversation="c-b")
        [waiting] = await wait_pending(own)
        assert [(c.grant_id, c.why_not) for c in waiting.grant_candidates] == [
            (taken.issued_grant, "issued by the user who asks (no self-grants)")]
        await api.review(own.id, waiting.tool_call_id, False, "carol")
        await own.result()
    assert grant_store.get(db, str(taken.issued_grant)).uses == 0
    assert len(grant_store.listed(db, include_ended=True)) == 1  # the refused ones: none


async def test_check_reports_a_use_without_its_audit_row(
        client: Client, task_queue: str, db: Database, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    async with running_worker(client, task_queue, db.url, [service()],
                              provider=FunctionModel(mailer)) as turns:
        api = TurnstileClient(client, turns.rt.settings)
        grant_id, _ = await issue(turns, api, GrantRequest(uses=2, constraints=TO_OPS))
        result = await turns.run("mail ops@example.com covered", service=SALES,
                                 conversation="c-g")
        assert result.status is TurnStatus.COMPLETED
    assert truth.grant_disagreements_of(db) == []
    with db.connect() as conn:
        conn.execute("UPDATE tool_execution_log SET grant_id = NULL WHERE grant_id = :g",
                     {"g": grant_id})
    found = truth.grant_disagreements_of(db)
    assert len(found) == 1 and f"grant {grant_id} was used by call" in found[0]
    assert "has no audit row naming it" in found[0]
    monkeypatch.setenv("DATABASE_URL", db.url)
    capsys.readouterr()
    assert await starter.main(["check"], client=client) == 1
    printed = capsys.readouterr().out
    assert found[0] in printed and printed.strip().endswith("1 disagreement(s)")
    with db.connect() as conn:
        conn.execute("DELETE FROM grant_use")
    assert truth.grant_disagreements_of(db) == [f"grant {grant_id} counts 1 use(s); "
                                                "grant_use holds 0"]


async def test_grants_list_and_revoke_from_the_command_line(
        client: Client, task_queue: str, db: Database, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    async with running_worker(client, task_queue, db.url, [service()],
                              provider=FunctionModel(mailer)) as turns:
        api = TurnstileClient(client, turns.rt.settings)
        grant_id, _ = await issue(turns, api, GrantRequest(uses=4, constraints=TO_OPS,
                                                           reason="weekly numbers"))
    monkeypatch.setenv("DATABASE_URL", db.url)
    capsys.readouterr()
    assert await starter.main(["grants", "list"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("1 grant(s) (live)") and grant_id in listed
    assert "o***@example.com" in listed and "ops@example.com" not in listed  # masked
    assert "0/4" in listed and "conversation:c-g" in listed
    assert await starter.main(["grants", "revoke", grant_id, "--by", "carol",
                               "--reason", "done"]) == 0
    assert f"grant {grant_id} revoked by carol" in capsys.readouterr().out
    assert await starter.main(["grants", "revoke", "g-nope", "--by", "carol"]) == 1
    assert "no grant 'g-nope'" in capsys.readouterr().out
    assert await starter.main(["grants", "revoke", grant_id, "--by", "b\ud800ob"]) == 2
    capsys.readouterr()
    assert await starter.main(["grants", "list"]) == 0
    assert capsys.readouterr().out.startswith("0 grant(s) (live)")
    # The console script, as an operator runs it.
    done = subprocess.run([sys.executable, "-m", "turnstile.cli.main", "grants", "list",
                           "--all", "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DATABASE_URL": db.url})
    assert done.returncode == 0, done.stderr
    [row] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (row["grant_id"], row["revoked_by"], row["state"]) == (grant_id, "carol",
                                                                   "revoked by carol")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_grant_covers_untrusted_arguments_only_when_it_says_so(
        client: Client, task_queue: str, tmp_path: Path, backend: str,
        request: pytest.FixtureRequest) -> None:
    """The information-flow desk (tests/test_information_flow.py): its model
    mails the address a read message injected. A grant for that address
    does not cover the call (its `to` came from a tool result), and says so
    on the pending call; one that says `covers_untrusted` does."""
    db = flow_desk.prepared(worker_database_url(backend, request, tmp_path))
    now = datetime.now(UTC)

    def granted(grant_id: str, covers_untrusted: bool) -> None:
        grant_store.issue(db, Grant(
            grant_id=grant_id, service="flow", tool_name="send_mail",
            scope=GrantScope.SERVICE, scope_key="flow",
            constraints={"to": Equals(value=flow_desk.ATTACKER)},
            until=stored_time(now + timedelta(hours=1)), max_uses=5,
            covers_untrusted=covers_untrusted, issued_by="bob",
            issued_at=stored_time(now)), chain="")

    async with running_worker(client, task_queue, db.url, [flow_desk.desk()],
                              provider=FunctionModel(flow_desk.compromised)) as turns:
        granted("g-cautious", covers_untrusted=False)
        handle = await turns.start("summarise my inbox", service="flow", conversation="c-1")
        [waiting] = await wait_pending(handle)
        assert [(c.grant_id, c.why_not) for c in waiting.grant_candidates] == [
            ("g-cautious", "to came from untrusted content")]
        await TurnstileClient(client, turns.rt.settings).review(
            handle.id, waiting.tool_call_id, False, "carol", "phishing")
        await handle.result()
        granted("g-explicit", covers_untrusted=True)
        covered = await turns.run("summarise my inbox", service="flow", conversation="c-2")
    assert covered.status is TurnStatus.COMPLETED, covered.error
    assert grant_store.get(db, "g-cautious").uses == 0
    assert grant_store.get(db, "g-explicit").uses == 1
    [row] = [r for r in audit_grants_of(db, "send_mail") if r["workflow_id"] == covered.workflow_id]
    assert row["grant_id"] == "g-explicit"


def audit_grants_of(db: Database, tool_name: str) -> list[dict[str, Any]]:
    with db.connect() as conn:
        return fetchall(conn, "SELECT workflow_id, grant_id FROM tool_execution_log "
                              "WHERE tool_name = :t", {"t": tool_name})
