"""No dead-end loops (turnstile.engine.dead_ends, revision 6): a
model that keeps making calls that can never run — a tool that needs
arguments called with none, a tool the breaker disabled, a tool that does not
exist, a call written as text that does not parse — is asked once for its
answer without tools, then its turn ends `failed` with `DeadEndCalls` naming
what it kept doing: never the round-trip cap, never `completed` with the call
text. A disabled tool is no longer offered. Real turns: the strict scripted
model server over HTTP, a Temporal dev server, SQLite (and PostgreSQL for the
llama-cpp-python finding)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from temporalio.client import Client, WorkflowHandle

from tests.support.databases import BACKENDS, worker_database_url
from tests.support.services import make_service
from tests.support.sql import fetchall
from tests.support.turns import running_worker
from turnstile.engine import attributes as attr
from turnstile.engine.answer_rules import calls_written_as_text, unparsed_call
from turnstile.engine.contract import ApproveSignal, CallStatus, PendingApproval, TurnStatus
from turnstile.engine.dead_ends import (
    ASK_NOW,
    DEAD_END_AFTER,
    DeadEnds,
    call_dead_end,
    no_arguments,
    text_dead_end,
)
from turnstile.engine.errors import ToolArgumentError
from turnstile.engine.model_settings import ModelSettings
from turnstile.engine.specs import LoopPolicy, ToolSpec
from turnstile.engine.tool_round_rules import without_arguments
from turnstile.sales.service import build_sales_service
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MAIL = {"to": "ops@example.com", "subject": "Follow up", "body": "C0001 and C0002"}
BARE = "functions.createEmailTask:"


def offered(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools", [])]


async def approve_all(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Approve every call that waits until the turn ends; the ids approved."""
    approved: list[str] = []
    while (await handle.describe()).close_time is None:
        for p in await handle.query("pending_approvals", result_type=list[PendingApproval]):
            if p.tool_call_id not in approved:
                approved.append(p.tool_call_id)
                await handle.signal("approve", ApproveSignal(tool_call_id=p.tool_call_id,
                                                             reviewer="ops-lead"))
        await asyncio.sleep(0.05)
    return approved


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_llama_cpp_python_finding_ends_dead_end_calls(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    """The finding, as measured on llama-cpp-python with the documented settings:
    a real createEmailTask (approved, queued), then `functions.createEmailTask:`
    six times. The bare head is no call: two such answers, one request without
    tools, the same again, and the turn ends `DeadEndCalls` — the mail kept,
    nothing more asked of the model, neither the cap nor the call text as an
    answer."""
    service = build_sales_service()
    service.model = ModelSettings(text_tool_calls=True, tool_results="text")
    fake_llm.script(text_reply("functions.createEmailTask:\n" + json.dumps(MAIL)),
                    *[text_reply(BARE) for _ in range(6)])
    url = worker_database_url(backend, request, tmp_path)
    async with running_worker(client, task_queue, url, [service], llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops", service="sales-assistant", conversation="c-dead")
        approved = await approve_all(handle)
        result = await handle.result()
        with turns.rt.db.connect() as conn:
            mails = fetchall(conn, "SELECT status FROM email_task")
            stored = fetchall(conn, "SELECT role, content, attributes FROM chat_message"
                                    " WHERE conversation_id = 'c-dead' ORDER BY seq")
        later = MemoryStore(turns.rt.db).messages("c-dead")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "DeadEndCalls", result.error
    assert BARE in result.error.message and "createEmailTask" in result.error.message
    assert result.answer != BARE
    assert len(approved) == 1
    assert [(c.name, c.status, c.rolled_back) for c in result.tool_calls] == [
        ("createEmailTask", CallStatus.COMPLETED, False)]
    assert [m["status"] for m in mails] == ["QUEUED"]  # queued once, not cancelled
    # the call, two bare heads, the ask without tools: four requests, not the cap
    assert len(fake_llm.requests) == 1 + DEAD_END_AFTER + 1
    ask = fake_llm.requests[-1]
    assert "tools" not in ask
    assert ask["messages"][-1]["content"] == ASK_NOW.format(
        what=f"writing `{BARE}` for createEmailTask, a call that does not parse")
    assert all(m.get("content") != BARE for r in fake_llm.requests for m in r["messages"])
    # Every bare head is kept in memory marked discarded, never sent again.
    heads = [json.loads(m["attributes"] or "{}") for m in stored
             if m["role"] == "assistant" and m["content"] == BARE]
    assert [a.get(attr.DISCARDED) for a in heads] == ["dead_end"] * 3
    assert all(m.content != BARE for m in later)
    assert not fake_llm.refusals


async def test_a_disabled_tool_is_no_longer_offered_and_calling_it_ends_the_turn(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """`refuses` fails three times in a row and is disabled: later requests do
    not offer it; two more calls of it are dead ends, the request without tools
    is answered with a call of it written as text: `DeadEndCalls`."""
    fake_llm.script(*[tool_reply((f"r{i}", "refuses", {})) for i in range(5)],
                    text_reply('{"name": "refuses", "arguments": {}}'))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("try it")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "DeadEndCalls", result.error
    assert "calling refuses, which was disabled" in result.error.message
    assert [c.status for c in result.tool_calls] == [CallStatus.FAILED] * 5
    assert [("refuses" in offered(r)) for r in fake_llm.requests] == [
        True, True, True, False, False, False]
    assert "tools" not in fake_llm.requests[-1]
    assert not fake_llm.refusals


async def test_an_unknown_tool_called_again_and_again_ends_the_turn(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """A model that only ever calls a tool that does not exist: two rounds,
    the request without tools (the call it makes there is dropped), then
    `DeadEndCalls` — three model requests."""
    fake_llm.default = lambda request: tool_reply(
        (f"x{len(request['messages'])}", "launchRockets", {"count": 3}))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("launch")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "DeadEndCalls", result.error
    assert "calling launchRockets, which does not exist" in result.error.message
    assert [c.status for c in result.tool_calls] == [CallStatus.UNKNOWN_TOOL] * 2
    assert len(fake_llm.requests) == 3 and "tools" not in fake_llm.requests[-1]


async def test_a_model_that_recovers_after_the_ask_completes(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """`echo` called twice with no arguments: not run, the model reads which
    arguments it needs; asked without tools, it answers: `completed`."""
    fake_llm.script(tool_reply(("e1", "echo", {})), tool_reply(("e2", "echo", "")),
                    text_reply("I could not echo: you gave me no text."))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("echo")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "I could not echo: you gave me no text."
    assert [c.status for c in result.tool_calls] == [CallStatus.INVALID_ARGUMENTS] * 2
    told = fake_llm.requests[1]["messages"][-1]
    assert told["role"] == "tool" and "echo was called with no arguments" in told["content"]
    assert "needs text" in told["content"]
    assert len(fake_llm.requests) == 3 and "tools" not in fake_llm.requests[-1]
    assert fake_llm.requests[-1]["messages"][-1]["content"] == ASK_NOW.format(
        what="calling echo with no arguments")


async def test_a_valid_call_between_dead_ends_resets_the_count(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """Dead ends count in a row: one, a call that runs, one more, then an
    answer — completed with no ask."""
    fake_llm.script(tool_reply(("e1", "echo", {})), tool_reply(("a1", "add", {"a": 1, "b": 2})),
                    text_reply("functions.echo:"), text_reply("3"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("add")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "3"
    assert all("tools" in r for r in fake_llm.requests)


# --- the rules, pure -----------------------------------------------------------------------

@pytest.mark.parametrize(("text", "called"), [
    ("functions.createEmailTask:", "createEmailTask"),
    ("functions.createEmailTask:\n", "createEmailTask"),
    ("functions.createEmailTask: {\"to\": ", "createEmailTask"),  # cut, does not parse
    ('{{"name": "createEmailTask", "arguments": {"to": "a@example.com"}}}}', "createEmailTask"),
    ('```json\n{"name": "createEmailTask"}\n```', "createEmailTask"),
    ('<function=createEmailTask>to=ops</function>', "createEmailTask"),
    # calls that parse are ToolCallAsText's (or text_tool_calls'), not dead ends
    ('functions.createEmailTask:\n{"to": "a@example.com"}', None),
    ('{"name": "createEmailTask", "arguments": {}}', None),
    # answers
    ("functions.createEmailTask: is what I would call next.", None),
    ("functions.launchRockets:", None),
    ("The e-mail was queued.", None),
    ("", None),
])
def test_what_is_a_call_that_does_not_parse(text: str, called: str | None) -> None:
    assert unparsed_call(text, ["createEmailTask", "querySalesData"]) == called


TOOL = ToolSpec(name="echo", description="", parameters={"required": ["text"]})
OPTIONAL = ToolSpec(name="checkEmailConfig", description="", parameters={})


@pytest.mark.parametrize(("name", "arguments", "tool", "disabled", "what"), [
    ("echo", "{}", TOOL, False, "calling echo with no arguments"),
    ("echo", " ", TOOL, False, "calling echo with no arguments"),
    ("echo", "null", TOOL, False, "calling echo with no arguments"),
    ("echo", '{"text": ""}', TOOL, False, None),  # an argument error the model can fix
    ("echo", '{"x": 1}', TOOL, False, None),
    ("checkEmailConfig", "{}", OPTIONAL, False, None),
    ("echo", '{"text": "hi"}', TOOL, True, "calling echo, which was disabled after repeated "
                                            "failures"),
    ("nope", "{}", None, False, "calling nope, which does not exist"),
])
def test_which_calls_are_dead_ends(name: str, arguments: str, tool: ToolSpec | None,
                                   disabled: bool, what: str | None) -> None:
    assert call_dead_end(name, arguments, tool, disabled) == what


def test_the_policy_keeps_the_required_arguments_only() -> None:
    spec = ToolSpec(name="echo", description="Echo.", parameters={
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    assert spec.policy().parameters == {"required": ["text"]}
    assert OPTIONAL.policy().parameters == {}
    assert call_dead_end("echo", "{}", spec.policy(), False) == "calling echo with no arguments"


def test_no_arguments_and_the_count() -> None:
    assert no_arguments("") and no_arguments("{ }") and not no_arguments("[]")
    assert not no_arguments('{"a": 1}') and not no_arguments("{" + " " * 100 + "}")
    count = DeadEnds()
    assert not count.record("calling x, which does not exist")
    assert not count.record(None) and count.in_row == 0
    assert not count.record("a") and count.record("b") and count.what == "b"
    assert text_dead_end('{"name": "refuses", "arguments": {}}', ["refuses"], {"refuses"}) == (
        "calling refuses, which was disabled after repeated failures")
    assert text_dead_end('{"name": "refuses", "arguments": {}}', ["refuses"], set()) is None


def test_a_call_without_arguments_is_settled_without_validation() -> None:
    settled = without_arguments("echo", "{}", TOOL, LoopPolicy())
    assert settled is not None and settled.status is CallStatus.INVALID_ARGUMENTS
    assert settled.text == ("Not run: echo was called with no arguments, and it needs text. "
                            "Call it with them, or answer the user without it.")
    assert settled.stop is None and settled.breaker_failure
    failing = without_arguments("echo", "", TOOL, LoopPolicy(on_invalid_arguments="fail"))
    assert failing is not None and isinstance(failing.stop, ToolArgumentError)
    assert without_arguments("echo", '{"text": "x"}', TOOL, LoopPolicy()) is None
    assert without_arguments("checkEmailConfig", "{}", OPTIONAL, LoopPolicy()) is None


@pytest.mark.parametrize(("text", "called"), [
    # A typed answer that names a tool in a "name" field is an answer.
    ('{"name": "createEmailTask", "summary": "queued one e-mail"}', None),
    ('[{"name": "querySalesData", "rows": 8}]', None),
    # A call in shape whose arguments are missing or not an object is a dead end.
    ('{"name": "createEmailTask"}', "createEmailTask"),
    ('{"type": "function", "function": {"name": "querySalesData"}}', "querySalesData"),
    ('{"name": "createEmailTask", "arguments": 5}', "createEmailTask"),
])
def test_json_that_parses_is_a_dead_end_only_in_a_call_s_shape(text: str,
                                                                called: str | None) -> None:
    assert unparsed_call(text, ["createEmailTask", "querySalesData"]) == called


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.builds("".join, st.lists(st.sampled_from(
    ["functions.createEmailTask:", "functions.x:", '{"name": "createEmailTask"', "{", "}", "[",
     '"arguments": ', "```json\n", "```", "<tool_call>", "\n", "text", '"a"']), max_size=15)))
def test_any_text_is_read_for_a_dead_end_without_error(text: str) -> None:
    """Whatever a model writes: read without raising, only an offered tool
    named, and never both a call that parses and a dead end."""
    offered = ["createEmailTask", "querySalesData"]
    name = unparsed_call(text, offered)
    assert name is None or name in offered
    if calls_written_as_text(text, offered):
        assert name is None
