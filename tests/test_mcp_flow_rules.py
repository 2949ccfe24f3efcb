"""Information-flow rules an operator declares for MCP tools in the server's
configuration (`tools: {name: {sensitive: {...}, trusted_results: ...}}`,
docs/mcp.md): a declared `refuse` argument whose value came from an MCP
answer (untrusted) is refused (FLOW_REFUSED) and the server never runs it;
with the answering tool declared trusted, the same call runs. An unknown
rule fails the configuration at load, an unknown argument at the listing;
an unknown tool is a warning in the logs. Real dev server, in-process
worker, the SDK-written test MCP server over stdio, scripted model over
HTTP."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from temporalio.client import Client

from tests.support.mcp_fixtures import Effects, stdio_server
from tests.support.turns import running_worker
from turnstile.engine.contract import AuditStatus, CallStatus, TurnStatus
from turnstile.engine.errors import ConfigurationError
from turnstile.runtime.mcp import MCPServer, MCPToolPolicy, parse_mcp_servers
from turnstile.runtime.services import Service
from turnstile.runtime.tools import ToolRegistry
from turnstile.stores.audit import AuditLog
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

ADDRESS = "mallory@example.com"  # in the contact tool's answer, never in the user's words


def service(server: MCPServer) -> Service:
    return Service(name="test", system_prompt="You keep notes.", tools=ToolRegistry(),
                   mcp_servers=[server])


def script(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("c1", "contact", {"person": "Mallory"})),
                    tool_reply(("c2", "add_note", {"text": f"write to {ADDRESS}"})),
                    text_reply("done"))


async def test_a_declared_refuse_argument_from_an_mcp_answer_is_refused(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer,
        effects: Effects, caplog: pytest.LogCaptureFixture) -> None:
    server = stdio_server(effects, tools={
        "add_note": MCPToolPolicy(sensitive={"text": "refuse"}),
        "no_such_tool": MCPToolPolicy(read_only=True)})
    script(fake_llm)
    with caplog.at_level(logging.WARNING, logger="turnstile.runtime.mcp.toolset"):
        async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                                  [service(server)], llm_url=fake_llm.url) as turns:
            result = await turns.run("look Mallory up and note her address")
            [row] = [r for r in AuditLog(turns.rt.db).rows(result.workflow_id)
                     if r.tool_name == "add_note"]
    assert result.status == TurnStatus.COMPLETED, result.error
    contact, note = result.tool_calls
    assert (note.name, note.status, note.is_error) == ("add_note", CallStatus.REJECTED, True)
    assert effects.runs("add_note") == [] and len(effects.runs("contact")) == 1
    assert row.status == AuditStatus.FLOW_REFUSED
    [source] = json.loads(row.provenance or "{}")["text"]
    assert (source["kind"], source["trusted"], source["tool_name"],
            source["tool_call_id"]) == ("mcp", False, "contact", contact.id)
    told = {m["tool_call_id"]: m["content"] for m in fake_llm.requests[-1]["messages"]
            if m["role"] == "tool"}
    assert told["c2"].startswith("Not run: add_note refuses values from untrusted content")
    assert "MCP tool contact" in told["c2"]
    warned = [r.getMessage() for r in caplog.records if "no_such_tool" in r.getMessage()]
    assert len(warned) == 1 and "'inventory' does not list tool 'no_such_tool'" in warned[0]


async def test_with_the_answering_tool_trusted_the_same_call_runs(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer,
        effects: Effects) -> None:
    server = stdio_server(effects, tools={
        "add_note": MCPToolPolicy(sensitive={"text": "refuse"}),
        "contact": MCPToolPolicy(trusted_results=True)})
    script(fake_llm)
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [service(server)], llm_url=fake_llm.url) as turns:
        result = await turns.run("look Mallory up and note her address")
        [row] = [r for r in AuditLog(turns.rt.db).rows(result.workflow_id)
                 if r.tool_name == "add_note"]
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 2
    assert [r["text"] for r in effects.runs("add_note")] == [f"write to {ADDRESS}"]
    assert row.status == AuditStatus.COMPLETED
    [source] = json.loads(row.provenance or "{}")["text"]
    assert (source["kind"], source["trusted"]) == ("mcp", True)


def test_an_unknown_rule_fails_the_configuration_at_load() -> None:
    bad = ('[{"name": "x", "command": "a", '
           '"tools": {"add_note": {"sensitive": {"text": "deny"}}}}]')
    with pytest.raises(ConfigurationError,
                       match="rule 'deny' for argument 'text' is not one of allow, review, "
                             "refuse"):
        parse_mcp_servers(bad)
    [ok] = parse_mcp_servers('[{"name": "x", "command": "a", "tools": {"add_note": '
                             '{"sensitive": {"text": "refuse"}, "trusted_results": false}}}]')
    assert ok.tools["add_note"].sensitive == {"text": "refuse"}


async def test_an_unknown_argument_fails_the_listing(effects: Effects) -> None:
    typo = service(stdio_server(effects, tools={
        "add_note": MCPToolPolicy(sensitive={"txet": "refuse"})}))
    with pytest.raises(ConfigurationError, match="sensitive argument 'txet' is not a parameter"):
        await typo.refresh_providers()
    # `{}` declares that no argument is sensitive; unset keeps the defaults.
    declared = service(stdio_server(effects, trust_hints=False, tools={
        "add_note": MCPToolPolicy(sensitive={})}))
    await declared.refresh_providers()
    note, lookup = declared.tool("add_note"), declared.tool("lookup")
    assert note is not None and note.spec.sensitive == {} and not note.spec.trusted_results
    # Hints not believed: every tool waits for approval, its text arguments reviewed.
    assert lookup is not None and lookup.spec.sensitive == {"key": "review"}


async def test_trusted_values_of_an_mcp_answer_vouch_for_whole_values_only(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer,
        effects: Effects) -> None:
    """`lookup` answers JSON ({"key", "value", "server"}); declared
    `trusted_values: ["value"]`, a note carrying that value runs, and one
    carrying the same answer's `server` (a key not named) is refused."""
    server = stdio_server(effects, tools={
        "add_note": MCPToolPolicy(sensitive={"text": "refuse"}),
        "lookup": MCPToolPolicy(trusted_values=["value"])})
    fake_llm.script(tool_reply(("c1", "lookup", {"key": "k1"})),
                    tool_reply(("c2", "add_note", {"text": "value-of-k1"})),
                    tool_reply(("c3", "add_note", {"text": "inventory"})),
                    text_reply("done"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [service(server)], llm_url=fake_llm.url) as turns:
        result = await turns.run("look k1 up and note it")
        vouched, other = [r for r in AuditLog(turns.rt.db).rows(result.workflow_id)
                          if r.tool_name == "add_note"]
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [r["text"] for r in effects.runs("add_note")] == ["value-of-k1"]
    assert vouched.status == AuditStatus.COMPLETED
    [source] = json.loads(vouched.provenance or "{}")["text"]
    assert (source["kind"], source["trusted"], source["key"]) == ("value", True, "value")
    assert other.status == AuditStatus.FLOW_REFUSED
    [source] = json.loads(other.provenance or "{}")["text"]
    assert (source["kind"], source["trusted"], source["tool_name"]) == ("mcp", False, "lookup")


def test_a_wrong_trusted_values_declaration_fails_the_listing_or_load() -> None:
    with pytest.raises(ConfigurationError):
        parse_mcp_servers('[{"name": "x", "command": "a", "tools": {"lookup": '
                          '{"trusted_values": 3}}}]')
