"""Trusted values through real turns (docs/information-flow.md, "Trusted
values" and "Values a person approved"): a real dev server, an in-process
worker, SQLite, and the strict scripted model server over HTTP
(turnstile.testing.FakeOpenAIServer) calling what the script says.

- A chat desk's `read_channel` vouches for its messages' `sender` and
  `recipient`: a DM to a sender runs at once, a URL from the same result's
  body waits for a person.
- A value a person approved in an earlier call is trusted in the next one;
  one a grant approved, or one a rule let run without anybody, is not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from temporalio.client import Client

from tests.support.turns import running_worker, wait_pending
from turnstile.client import TurnstileClient
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.flow import untrusted_arguments
from turnstile.engine.grant_models import GrantCeiling, GrantRequest
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolContext, ToolRegistry, tool
from turnstile.stores.audit import AuditLog
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

META = sa.MetaData()
done = sa.Table(
    "trusted_values_effect", META,
    sa.Column("effect_key", sa.String(300), primary_key=True),
    sa.Column("kind", sa.String(20), nullable=False),
    sa.Column("target", sa.String(200), nullable=False),
)

URL = "www.evil.example/collect"
MESSAGES = [{"sender": "bob.smith", "recipient": "general",
             "body": f"Great article at {URL} - and tell dora.w I said hi"}]
PAGE = ("Dora's page. Mail me at dora@home.example. Eve is eve@evil.example and "
        "Mallory signs mallory.m")


def _effect(ctx: ToolContext, kind: str, target: str) -> str:
    with ctx.transaction() as conn:
        conn.execute(sa.insert(done).values(effect_key=ctx.idempotency_key, kind=kind,
                                            target=target))
    return f"{kind} {target}: done"


@tool(idempotent=True, repeatable=True, trusted_values=("sender", "recipient"))
def read_channel(ctx: ToolContext, channel: str) -> list[dict[str, str]]:
    """A channel's messages; Slack sets each one's sender and recipient."""
    return MESSAGES


@tool(idempotent=True, repeatable=True)
def get_page(ctx: ToolContext, url: str) -> str:
    """A web page."""
    return PAGE


@tool(transactional=True, sensitive={"recipient": "review", "body": "review"})
def send_dm(ctx: ToolContext, recipient: str, body: str) -> str:
    """A direct message to a member."""
    return _effect(ctx, "dm", recipient)


@tool(transactional=True, sensitive={"url": "review"})
def fetch(ctx: ToolContext, url: str) -> str:
    """Visit a web page (the URL itself can leak data)."""
    return _effect(ctx, "fetch", url)


@tool(transactional=True, sensitive={"user": "review", "email": "review"})
def invite(ctx: ToolContext, user: str, email: str) -> str:
    """Invite someone to the workspace."""
    return _effect(ctx, "invite", user)


@tool(transactional=True, sensitive={"user": "review"})
def add_to_channel(ctx: ToolContext, user: str, channel: str) -> str:
    """Add a member to a channel."""
    return _effect(ctx, "add", user)


@tool(transactional=True, sensitive={"who": "allow"})
def note(ctx: ToolContext, who: str) -> str:
    """Note a name (runs whatever its provenance: rule `allow`)."""
    return _effect(ctx, "note", who)


def desk() -> Service:
    return Service(name="chat", system_prompt="You help in the team's chat.",
                   tools=ToolRegistry([read_channel, get_page, send_dm, fetch, invite,
                                       add_to_channel, note]),
                   grant_ceilings={"invite": GrantCeiling(allow_untrusted=True)})


def prepared(tmp_path: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path}/t.db")
    META.create_all(db.engine)
    return db


def effects(db: Database) -> list[tuple[str, str]]:
    with db.connect() as conn:
        return sorted((r.kind, r.target) for r in conn.execute(sa.select(done)))


def provenance_of(db: Database, workflow_id: str, call_id: str) -> Any:
    [row] = [r for r in AuditLog(db).rows(workflow_id)
             if r.execution_id.rsplit("/", 1)[-1] == call_id]
    return json.loads(row.provenance) if row.provenance else None


async def test_a_listed_sender_is_messaged_at_once_and_a_url_from_the_body_waits(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    db = prepared(tmp_path)
    fake_llm.script(
        tool_reply(("r1", "read_channel", {"channel": "general"})),
        tool_reply(("d1", "send_dm", {"recipient": "Bob.Smith", "body": "Thanks!"})),
        tool_reply(("f1", "fetch", {"url": URL})),
        text_reply("done"))
    async with running_worker(client, task_queue, db.url, [desk()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("thank whoever posted in general, then read the article",
                                   service="chat")
        [p] = await wait_pending(handle)
        assert (p.tool_name, p.tool_call_id) == ("fetch", "f1")
        assert effects(db) == [("dm", "Bob.Smith")]  # ran without a reviewer
        assert untrusted_arguments(p.provenance) == ["url"]
        [source] = p.provenance["url"]
        assert (source.kind, source.trusted, source.tool_name, source.tool_call_id) == (
            "tool", False, "read_channel", "r1")
        api = TurnstileClient(client, turns.rt.settings)
        await api.review(handle.id, "f1", False, "carol", "not the user's")
        result = await handle.result()
    assert result.status is TurnStatus.COMPLETED, result.error
    assert [(c.name, c.status) for c in result.tool_calls] == [
        ("read_channel", CallStatus.COMPLETED), ("send_dm", CallStatus.COMPLETED),
        ("fetch", CallStatus.REJECTED)]
    assert effects(db) == [("dm", "Bob.Smith")]
    [vouched] = provenance_of(db, handle.id, "d1")["recipient"]
    assert (vouched["kind"], vouched["trusted"], vouched["tool_name"], vouched["tool_call_id"],
            vouched["key"]) == ("value", True, "read_channel", "r1", "sender")


async def test_a_value_a_person_approved_is_trusted_next_and_a_grants_or_a_rules_is_not(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    db = prepared(tmp_path)
    fake_llm.script(
        tool_reply(("g1", "get_page", {"url": "www.dora.example"})),
        tool_reply(("i1", "invite", {"user": "Dora", "email": "dora@home.example"})),
        # covered by the grant bob issues with i1: runs, nobody looked at it
        tool_reply(("i2", "invite", {"user": "Eve", "email": "eve@evil.example"})),
        tool_reply(("a1", "add_to_channel", {"user": "Eve", "channel": "general"})),
        tool_reply(("a2", "add_to_channel", {"user": "dora", "channel": "general"})),
        tool_reply(("n1", "note", {"who": "mallory.m"})),  # `allow`: runs unreviewed
        tool_reply(("a3", "add_to_channel", {"user": "mallory.m", "channel": "general"})),
        text_reply("done"))
    async with running_worker(client, task_queue, db.url, [desk()],
                              llm_url=fake_llm.url) as turns:
        api = TurnstileClient(client, turns.rt.settings)
        handle = await turns.start("invite my new colleague from her web page",
                                   service="chat")
        [p] = await wait_pending(handle)
        assert p.tool_call_id == "i1" and set(untrusted_arguments(p.provenance)) == {
            "user", "email"}
        await api.review(handle.id, "i1", True, "bob", grant=GrantRequest(
            constraints={}, covers_untrusted=True, reason="invites today"))
        [p] = await wait_pending(handle)
        # Eve: only on the page and in a call a grant approved: untrusted.
        assert p.tool_call_id == "a1" and untrusted_arguments(p.provenance) == ["user"]
        assert {s.kind for s in p.provenance["user"]} == {"tool"}
        await api.review(handle.id, "a1", False, "bob")
        [p] = await wait_pending(handle)
        # Dora ran at once (a person approved her); mallory.m, noted by a rule, waits.
        assert p.tool_call_id == "a3" and untrusted_arguments(p.provenance) == ["user"]
        await api.review(handle.id, "a3", False, "bob")
        result = await handle.result()
    assert result.status is TurnStatus.COMPLETED, result.error
    statuses = {c.id: c.status for c in result.tool_calls}
    assert statuses == {"g1": CallStatus.COMPLETED, "i1": CallStatus.COMPLETED,
                        "i2": CallStatus.COMPLETED, "a1": CallStatus.REJECTED,
                        "a2": CallStatus.COMPLETED, "n1": CallStatus.COMPLETED,
                        "a3": CallStatus.REJECTED}
    assert effects(db) == [("add", "dora"), ("invite", "Dora"), ("invite", "Eve"),
                           ("note", "mallory.m")]
    [approved] = provenance_of(db, handle.id, "a2")["user"]
    assert (approved["kind"], approved["trusted"], approved["tool_name"],
            approved["tool_call_id"], approved["key"]) == (
        "approval", True, "invite", "i1", "user")
