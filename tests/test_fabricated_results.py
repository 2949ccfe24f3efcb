"""A tool result the model wrote itself is no answer (revision 9;
turnstile.engine.answer_rules.fabricated_result): Qwen2.5-Coder-1.5B under
llama-server answered with a made-up `<tool_response>{"taskId": ...,
"status": "QUEUED"}` for a createEmailTask it never called (measured,
bench/results/real_model/llama-server-1.5b-text-calls.json), and the turn
completed with it. Now the answer is discarded and the model asked once more
without tools, with a nudge; a made-up result again ends the turn `failed`
with `FabricatedToolResult`, nothing run. Pure rules with the measured
replies and properties; real turns on the scripted model server over HTTP, a
Temporal dev server, SQLite (and PostgreSQL for the measured reply twice).
Turns begun before revision 9 complete with such an answer, and replay so
(tests/histories/fabricated_result_before.json, tests/test_replay.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from temporalio.client import Client

from tests.support.databases import BACKENDS, worker_database_url
from tests.support.services import make_service
from tests.support.sql import fetchall
from tests.support.turns import running_worker
from turnstile.engine import attributes as attr
from turnstile.engine.answer_rules import (
    EXCERPT_CHARS,
    FABRICATED_NUDGE,
    SCAN_LIMIT,
    fabricated_result,
)
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.model_settings import ModelSettings
from turnstile.sales.service import build_sales_service
from turnstile.stores.audit import AuditLog
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

MEASURED = Path(__file__).resolve().parents[1] / (
    "bench/results/real_model/llama-server-1.5b-text-calls.json")
RUNS: list[dict[str, Any]] = json.loads(MEASURED.read_text())
# Run 1: prose, then the made-up result; run 4: only the made-up result.
PROSE_THEN_RESULT = RUNS[0]["answer"]
ONLY_A_RESULT = RUNS[3]["answer"]
HONEST = "I did not e-mail ops: no e-mail was sent. Shall I send one?"


# --- the rule, pure ------------------------------------------------------------------------

def test_the_measured_replies_that_make_up_a_result_are_the_ones_found() -> None:
    """Every final answer of the measured series: the two made-up
    `<tool_response>` blocks are found, the four other answers (a call
    explained in prose, customers named) are not."""
    assert PROSE_THEN_RESULT.startswith("To follow up, call createEmailTask once:\n<tool_")
    assert ONLY_A_RESULT.startswith("<tool_response>\n{\"taskId\":\"T0001\"")
    found = [fabricated_result(run["answer"]) for run in RUNS]
    assert [f is not None for f in found] == [True, False, False, True, False, False]
    assert found[0] is not None and found[0].startswith(
        '<tool_response> {"taskId":"12345","status":"QUEUED","to":"ops@example.com"')
    assert found[3] is not None and len(found[3]) <= 4 * EXCERPT_CHARS


@pytest.mark.parametrize(("text", "starts"), [
    (PROSE_THEN_RESULT, "<tool_response>"),
    (ONLY_A_RESULT, "<tool_response>"),
    ('{"taskId": "12345", "status": "created"}\n</tool_response>\nI have emailed ops.',
     "</tool_response>"),  # the block's opening cut away: its end still says it
    ('<tool_response name="createEmailTask">{"taskId": 1}</tool_response>', "<tool_response"),
    ("<TOOL_RESPONSE>{}</TOOL_RESPONSE>", "<TOOL_RESPONSE>"),
    ('<tool_result>{"ok": true}</tool_result> Done.', "<tool_result>"),
    ("<function_results>\n<result>sent</result>\n</function_results>", "<function_results>"),
    ("Sent. <function_result>{\"id\": 7}</function_result>", "<function_result>"),
    ('[TOOL_RESULTS] {"content": {"taskId": 1}, "call_id": "abc123xyz"}[/TOOL_RESULTS]',
     "[TOOL_RESULTS]"),  # Mistral v0.3's template
    ('<|start_header_id|>ipython<|end_header_id|>\n\n{"taskId": 1}<|eot_id|>',
     "<|start_header_id|>ipython"),  # Llama 3.1/3.2's templates
    # `ModelSettings(tool_results="text")` shows results so
    # (turnstile.providers.openai_compat.calls_as_text); the model copies the form.
    ('Called createEmailTask [call c9] with {"to": "ops@example.com"}\n'
     'Result of createEmailTask [call c9]:\n{"taskId": "T1"}\nI have emailed ops.',
     "Result of createEmailTask [call c9]:"),
    ("Result of a tool [call x] (error):\nboom", "Result of a tool [call x] (error):"),
    # Quoted in a fence by an otherwise plain answer: found too (answer_rules
    # says why: nothing tells an example from a made-up result).
    ("The server wraps results like this:\n```xml\n<tool_response>{...}</tool_response>\n```",
     "<tool_response>"),
])
def test_a_tool_result_written_anywhere_is_found(text: str, starts: str) -> None:
    found = fabricated_result(text)
    assert found is not None and found.startswith(starts), found


@pytest.mark.parametrize("text", [
    "I have emailed ops.",  # a claim without a result block: not this rule's
    "The tool response said the e-mail was queued (taskId T0001).",
    "tool_response, tool_result and function_results are tag names.",
    "<tool_responsibility> is not a tag we know",
    "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>",  # a call, not a result
    "The result of the query: 8 customers.",
    "Result of add [call a1] was 3.",  # no colon after the bracket: prose
    "Result of add: 3",
    "[TOOL_CALLS] is Mistral's call marker",
    "<|start_header_id|>assistant<|end_header_id|>",
    "",
    *[run["answer"] for run in RUNS if "<tool_response>" not in run["answer"]],
])
def test_an_answer_without_a_result_block_is_an_answer(text: str) -> None:
    assert fabricated_result(text) is None


def test_a_long_answer_is_scanned_at_its_start_and_its_end() -> None:
    block = '<tool_response>{"taskId": 1}</tool_response>'
    filler = "All fine. " * (SCAN_LIMIT // 5)  # 2 x SCAN_LIMIT characters
    assert fabricated_result(block + filler) is not None
    assert fabricated_result(filler + block) is not None
    assert fabricated_result(filler[:SCAN_LIMIT] + block + filler) is None  # not scanned


# Every word a result marker holds; an answer without any of them is never flagged.
MARKER_WORDS = ("tool_response", "tool_result", "function_result", "ipython", "result of")
FRAGMENTS = st.sampled_from([
    "<", ">", "</", "tool_", "response", "result", "results", "function_", "[call ", "]",
    ":", " (error)", "[TOOL_", "RESULTS]", "[/", "<|start_header_id|>", "<|end_header_id|>",
    "ipyth", "on", "Result", " of ", "Result of", "add", "\n", " ", "```", "{\"taskId\": 1}",
    "<tool_call>", "</tool_call>", "é", "\x00", "\ud800",
])
TEXTS = st.one_of(st.text(max_size=300), st.lists(FRAGMENTS | st.text(max_size=8),
                                                  max_size=80).map("".join))


@settings(max_examples=400, deadline=None)
@given(text=TEXTS)
def test_any_text_is_read_quickly_and_only_a_marker_is_flagged(text: str) -> None:
    started = time.perf_counter()
    found = fabricated_result(text)
    assert time.perf_counter() - started < 0.5
    assert found is None or isinstance(found, str)
    if not any(word in text.lower() for word in MARKER_WORDS):
        assert found is None, text


@settings(max_examples=200, deadline=None)
@given(before=TEXTS, after=TEXTS, marker=st.sampled_from([
    "<tool_response>", "</tool_response>", "<tool_result>", "<function_results>",
    "</function_result>", "[TOOL_RESULTS]", "<|start_header_id|>ipython<|end_header_id|>",
    "\nResult of createEmailTask [call text-call-0]:\n"]))
def test_a_marker_anywhere_is_flagged(before: str, after: str, marker: str) -> None:
    assert fabricated_result(before + marker + after) is not None


@pytest.mark.parametrize("text", [
    "<tool_response" * 50_000,  # openings that never close
    "Result of " + "x" * 1_000_000,
    ("Result of x [call " + "y" * 300) * 3_000,
    "<" * 1_000_000,
    "[TOOL_RESULTS" * 100_000,
])
def test_hostile_texts_are_read_in_bounded_time(text: str) -> None:
    started = time.perf_counter()
    fabricated_result(text)
    assert time.perf_counter() - started < 1.0


# --- real turns ----------------------------------------------------------------------------

def measured_sales_service() -> Any:
    """The sales app with the measured series' settings (calls written as
    text read as calls, results sent as text)."""
    service = build_sales_service()
    service.model = ModelSettings(text_tool_calls=True, tool_results="text")
    return service


async def test_a_made_up_result_is_asked_again_and_an_honest_answer_completes(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """The measured reply (prose, then a made-up `<tool_response>` for a
    createEmailTask never called): discarded, the model asked once more
    without tools with the nudge; its honest answer completes the turn.
    Neither the made-up result nor the nudge reaches a later turn."""
    fake_llm.script(text_reply(PROSE_THEN_RESULT), text_reply(HONEST), text_reply("Hello."))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [measured_sales_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("mail ops the customers", service="sales-assistant",
                                 conversation="c-made-up")
        later = await turns.run("hi", service="sales-assistant", conversation="c-made-up")
        with turns.rt.db.connect() as conn:
            mails = fetchall(conn, "SELECT status FROM email_task")
            stored = fetchall(conn, "SELECT role, content, attributes FROM chat_message"
                                    " WHERE conversation_id = 'c-made-up' ORDER BY seq")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == HONEST
    assert result.tool_calls == [] and mails == []
    first, again, next_turn = fake_llm.requests
    assert "tools" in first and "tools" not in again  # asked once more, without tools
    assert again["messages"][-1] == {"role": "user", "content": FABRICATED_NUDGE}
    asked = again["messages"][-2]  # the user's message (with what the service retrieved)
    assert asked["role"] == "user" and asked["content"].startswith("mail ops the customers")
    assert all("<tool_response>" not in str(m.get("content")) for m in again["messages"])
    # Memory keeps the made-up answer marked discarded; the nudge is never stored.
    made_up = [json.loads(m["attributes"] or "{}") for m in stored
               if m["content"] == PROSE_THEN_RESULT]
    assert [a.get(attr.DISCARDED) for a in made_up] == ["fabricated_result"]
    assert all(m["content"] != FABRICATED_NUDGE for m in stored)
    assert [m["role"] for m in next_turn["messages"]] == ["system", "user", "assistant", "user"]
    assert next_turn["messages"][2]["content"] == HONEST
    assert FABRICATED_NUDGE not in str(next_turn["messages"])
    assert later.status == TurnStatus.COMPLETED and later.answer == "Hello."
    assert not fake_llm.refusals


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_made_up_result_twice_ends_failed_with_fabricated_tool_result(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer, backend: str,
        request: pytest.FixtureRequest) -> None:
    """The measured reply that is only a made-up result, again when asked
    without tools: `failed`, `FabricatedToolResult` naming what it wrote (the
    address masked); nothing run, no mail, no answer given."""
    fake_llm.script(text_reply(ONLY_A_RESULT), text_reply(ONLY_A_RESULT))
    url = worker_database_url(backend, request, tmp_path)
    async with running_worker(client, task_queue, url, [measured_sales_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("mail ops the customers", service="sales-assistant",
                                   conversation="c-made-up-twice")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
        with turns.rt.db.connect() as conn:
            mails = fetchall(conn, "SELECT status FROM email_task")
        stored = MemoryStore(turns.rt.db).messages("c-made-up-twice")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "FabricatedToolResult", result.error
    assert "wrote a tool result itself (`<tool_response> {\"taskId\":\"T0001\"" in (
        result.error.message)
    assert "o***@example.com" in result.error.message
    assert "ops@example.com" not in result.error.message
    assert result.answer is None
    assert result.tool_calls == [] and audit == [] and mails == []
    assert len(fake_llm.requests) == 2 and "tools" not in fake_llm.requests[1]
    assert fake_llm.requests[1]["messages"][-1]["content"] == FABRICATED_NUDGE
    # Both answers are kept discarded: a later turn is never shown them.
    assert [m.role for m in stored] == ["system", "user"]
    assert not fake_llm.refusals


async def test_a_result_line_after_a_real_call_is_asked_again_from_the_real_results(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """Results sent as text (`tool_results="text"`): after a real call of
    add, the model writes its own `Result of add [call a1]:` line with
    another sum. Asked once more, the request still carries the real result
    (and the nudge after it); the answer from it completes the turn, add ran
    once."""
    service = make_service()
    service.model = ModelSettings(tool_results="text")
    fake_llm.script(tool_reply(("a1", "add", {"a": 1, "b": 2})),
                    text_reply("Result of add [call a1]:\n{\"sum\": 4}\nThe sum is 4."),
                    text_reply("The sum is 3."))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [service], llm_url=fake_llm.url) as turns:
        result = await turns.run("add 1 and 2")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "The sum is 3."
    assert [(c.name, c.status) for c in result.tool_calls] == [("add", CallStatus.COMPLETED)]
    again = fake_llm.requests[2]
    assert "tools" not in again
    real, nudge = again["messages"][-2:]
    assert real["role"] == "user" and real["content"].startswith("Result of add [call a1]:\n")
    assert '"sum": 3' in real["content"]
    assert nudge == {"role": "user", "content": FABRICATED_NUDGE}
    assert all("The sum is 4." not in str(m.get("content")) for m in again["messages"])
