"""Honest endings for answers that are not answers: an empty
answer is asked for once more without tools, then ends `failed`
(`EmptyAnswer`), never `completed` with nothing; a tool call written as text
ends `failed` (`ToolCallAsText`) without running it. Real turns: the
scripted model server over HTTP, a Temporal dev server, SQLite (and
PostgreSQL for the empty answer twice, a call written as text refused, and
calls written as text read as calls)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.support.databases import BACKENDS, worker_database_url
from tests.support.services import make_service
from tests.support.sql import fetchall
from tests.support.turns import running_worker
from turnstile.engine import attributes as attr
from turnstile.engine.answer_rules import EMPTY_NUDGE, calls_written_as_text, tool_call_as_text
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.model_settings import ModelSettings
from turnstile.stores.audit import AuditLog
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


def null_reply() -> dict[str, Any]:
    """What chatml-function-calling answers while tools are offered: no text at all."""
    reply = text_reply("")
    reply["choices"][0]["message"]["content"] = None
    return reply


@pytest.mark.parametrize("backend", BACKENDS)
async def test_empty_twice_ends_failed_with_empty_answer(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    fake_llm.script(null_reply(), text_reply("  \n "))
    async with running_worker(client, task_queue, worker_database_url(backend, request, tmp_path),
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("who?", conversation="c-empty")
        fake_llm.script(text_reply("Nobody."))
        after = await turns.run("and now?", conversation="c-empty")
        with turns.rt.db.connect() as conn:
            stored = fetchall(conn, "SELECT role, content, attributes FROM chat_message"
                                    " WHERE conversation_id = 'c-empty' ORDER BY seq")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "EmptyAnswer"
    assert "empty" in result.error.message
    first, again, later = fake_llm.requests
    assert "tools" in first and "tools" not in again  # asked once more, without tools
    assert again["messages"][-1] == {"role": "user", "content": EMPTY_NUDGE}
    assert again["messages"][-2]["role"] == "user"  # the empty answer is not sent back
    # Memory keeps the empty answers marked discarded; later turns never see them,
    # nor the nudge.
    empties = [json.loads(m["attributes"] or "{}") for m in stored
               if m["role"] == "assistant" and not (m["content"] or "").strip()]
    assert [a.get(attr.DISCARDED) for a in empties] == ["empty_answer"] * 2
    assert [m["role"] for m in later["messages"]] == ["system", "user", "user"]
    assert EMPTY_NUDGE not in str(later["messages"])
    assert after.status == TurnStatus.COMPLETED and after.answer == "Nobody."


async def test_empty_then_text_completes(client: Client, task_queue: str, tmp_path: Path,
                                         fake_llm: FakeOpenAIServer) -> None:
    """After a tool round, an empty answer and then a real one: completed, with
    the real one; the tool ran once."""
    fake_llm.script(tool_reply(("a1", "add", {"a": 1, "b": 2})), text_reply(""),
                    text_reply("The sum is 3."))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("add 1 and 2")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "The sum is 3."
    assert [(c.name, c.status) for c in result.tool_calls] == [("add", CallStatus.COMPLETED)]
    reask = fake_llm.requests[2]
    assert "tools" not in reask
    assert [m["role"] for m in reask["messages"][-3:]] == ["assistant", "tool", "user"]
    assert reask["messages"][-1]["content"] == EMPTY_NUDGE
    assert not fake_llm.refusals


CALL_AS_TEXT = '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```'


@pytest.mark.parametrize("backend", BACKENDS)
async def test_tool_call_written_as_text_is_not_run(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    fake_llm.script(text_reply(CALL_AS_TEXT))
    async with running_worker(client, task_queue, worker_database_url(backend, request, tmp_path),
                              [make_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("add 1 and 2", conversation="c-as-text")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
        stored = MemoryStore(turns.rt.db).messages("c-as-text")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "ToolCallAsText"
    assert "wrote a call of add as text" in result.error.message
    assert "--jinja" in result.error.message
    assert result.tool_calls == [] and len(fake_llm.requests) == 1  # nothing ran, no re-ask
    assert audit == []
    assert [(m.role, m.content, m.tool_calls) for m in stored[1:]] == [
        ("user", "add 1 and 2", []), ("assistant", CALL_AS_TEXT, [])]  # kept as text


@pytest.mark.parametrize(("text", "called"), [
    (CALL_AS_TEXT, "add"),
    ('{"name": "add", "arguments": {"a": 1}}', "add"),
    ('<tool_call>\n{"name": "echo", "arguments": {"text": "x"}}\n</tool_call>', "echo"),
    ('Here it is:\n```\n[{"type": "function", "function": {"name": "add", '
     '"arguments": "{\\"a\\": 1}"}}]\n```', "add"),
    ('```json\n{"name": "add", "parameters": {"a": 1}}\n```', "add"),
    # Qwen2.5-Coder under llama-server's template (measured): several calls in
    # <tools>, one per line, the second cut off with the answer.
    ('<tools>\n{"name": "echo", "arguments": {"text": "x"}}\n{"name": "add", "arguments": '
     '{"a": 1, "b":', "echo"),
    ('{"name": "unknown", "arguments": {}}\n{"name": "add", "arguments": {"a": 1}}', "add"),
    # ... and as XML-ish tags, also measured there.
    ('<tools>\n<function name="echo" arguments=\'{"text": "x"}\'/>\n<func', "echo"),
    ('<function=add>{"a": 1}</function>', "add"),
    ('<function name="add" arguments=\'not json\'/>', None),
    # llama-cpp-python's chatml-function-calling format; asked for its answer
    # without tools after a repeat, the model wrote only the head (measured):
    # not a call (from revision 6 a dead end, tests/test_dead_ends.py).
    ("functions.echo:", None),
    ('functions.add:\n{"a": 1, "b": 2}\nfunctions.echo:\n{"text": "x"}', "add"),
    ("functions.add: is how I would do it, but the sum is 3.", None),
    ("functions.launchRockets:", None),
    # Answers, not calls:
    ('```json\n{"name": "launchRockets", "arguments": {}}\n```', None),  # not offered
    ('{"name": "add"}', None),  # no arguments
    ('{"sum": 3}', None),
    ("The sum is 3.", None),
    ("", None),
    ("I would call add with a=1, b=2:\n```json\n{\"name\": \"add\", \"arguments\": {}}\n```\n"
     + "Then the result is reported, with a long explanation around it. " * 5, None),
])
def test_what_counts_as_a_call_written_as_text(text: str, called: str | None) -> None:
    assert tool_call_as_text(text, ["add", "echo"]) == called


def test_turns_begun_before_revision_6_read_a_bare_head_as_a_call() -> None:
    """They replay the rule they ran: `functions.NAME:` alone was a call with `{}`."""
    assert tool_call_as_text("functions.echo:", ["add", "echo"], bare_heads=True) == "echo"
    assert calls_written_as_text('functions.add:\n{"a": 1}\nfunctions.echo:', ["add", "echo"],
                                 bare_heads=True) == [("add", '{"a": 1}'), ("echo", "{}")]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_calls_written_as_text_run_when_the_service_reads_them(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    """`ModelSettings(text_tool_calls=True)`: the same answer is read as the
    calls it writes (two, in <tools>, as Qwen2.5-Coder writes them under
    llama-server); they run as calls, memory holds them as calls with their
    results, and a strict endpoint accepts the next request."""
    service = make_service()
    service.model = ModelSettings(text_tool_calls=True)
    fake_llm.script(
        text_reply('<tools>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
                   '{"name": "echo", "arguments": {"text": "hi"}}\n</tools>'),
        text_reply("3, and hi."))
    async with running_worker(client, task_queue, worker_database_url(backend, request, tmp_path),
                              [service], llm_url=fake_llm.url) as turns:
        handle = await turns.start("add 1 and 2, then echo hi", conversation="c-read")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
        stored = MemoryStore(turns.rt.db).messages("c-read")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert [(c.name, c.status) for c in result.tool_calls] == [
        ("add", CallStatus.COMPLETED), ("echo", CallStatus.COMPLETED)]
    second = fake_llm.requests[1]["messages"]
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "tool"]
    assert second[-3]["content"] == ""
    assert [c["function"]["name"] for c in second[-3]["tool_calls"]] == ["add", "echo"]
    assert not fake_llm.refusals
    # Both ran (at once: the audit's order by start time is either).
    assert sorted((r.tool_name, r.status) for r in audit) == [("add", "COMPLETED"),
                                                               ("echo", "COMPLETED")]
    called = stored[2]
    assert [m.role for m in stored] == ["system", "user", "assistant", "tool", "tool",
                                        "assistant"]
    assert [c.name for c in called.tool_calls] == ["add", "echo"]
    assert {m.tool_call_id for m in stored[3:5]} == {c.id for c in called.tool_calls}
    assert stored[-1].content == "3, and hi."


@pytest.mark.parametrize(("text", "calls"), [
    (CALL_AS_TEXT, [("add", '{"a": 1, "b": 2}')]),
    ('<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"x\\"}"}</tool_call>',
     [("echo", '{"text": "x"}')]),
    ('{"name": "add", "arguments": {"a": 1}}\n{"name": "launchRockets", "arguments": {}}',
     [("add", '{"a": 1}')]),  # a tool the service does not offer is left out
    ('<tools><function name="add" arguments=\'{"a": 1}\'/>\n'
     '<function name="echo" arguments=\'{"text": "y"}\'/></tools>',
     [("add", '{"a": 1}'), ("echo", '{"text": "y"}')]),
    # A head without arguments is no call (never a call with `{}`).
    ('functions.add:\n{"a": 1}\nfunctions.echo:', [("add", '{"a": 1}')]),
    ("functions.createEmailTask:", []),
    ("The sum is 3.", []),
])
def test_which_calls_an_answer_writes(text: str, calls: list[tuple[str, str]]) -> None:
    assert calls_written_as_text(text, ["add", "echo"]) == calls
