"""Constrained tool calls (`ModelSettings(constrain_tool_calls=True)`,
turnstile.engine.constrained_calls): the request carries no `tools` but a
`response_format` JSON schema — "one of these tool calls, or a final
answer", each call's arguments in the grammar dialect — and names the tools
in its system message; the reply is read back as calls or an answer, and the
arguments are still validated against the tool's full schema. Real turns:
the strict scripted model server over HTTP, a Temporal dev server, SQLite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.engine.constrained_calls import read_reply, reply_schema
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.model_settings import ModelSettings
from turnstile.engine.specs import ToolSpec
from turnstile.testing import FakeOpenAIServer, RawReply, text_reply


def constrained(value: dict[str, Any]) -> dict[str, Any]:
    return text_reply(json.dumps(value))


async def test_calls_and_the_answer_travel_as_the_constrained_schema(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    service = make_service()
    service.model = ModelSettings(constrain_tool_calls=True)
    fake_llm.script(
        constrained({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}},
                                    {"name": "echo", "arguments": {"text": "hi"}}]}),
        # b must be >= 0: the full schema says so (the grammar dialect keeps
        # integer bounds; validation does not depend on it)
        constrained({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": -5}}]}),
        constrained({"answer": "3, and hi."}))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add 1 and 2, then echo hi")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.answer == "3, and hi."
    assert [(c.name, c.status) for c in result.tool_calls] == [
        ("add", CallStatus.COMPLETED), ("echo", CallStatus.COMPLETED),
        ("add", CallStatus.INVALID_ARGUMENTS)]
    first = fake_llm.requests[0]
    assert "tools" not in first and "tool_choice" not in first
    fmt = first["response_format"]
    # The form llama-cpp-python's server reads (it refuses "json_schema").
    assert fmt["type"] == "json_object" and set(fmt) == {"type", "schema"}
    calls = fmt["schema"]["anyOf"][1]["properties"]["tool_calls"]["items"]["anyOf"]
    names = [c["properties"]["name"]["enum"][0] for c in calls]
    assert "add" in names and "echo" in names
    add = calls[names.index("add")]["properties"]["arguments"]
    assert add["required"] == ["a", "b"]
    system = first["messages"][0]
    assert system["role"] == "system" and '{"tool_calls"' in system["content"]
    assert "- add(a, b)" in system["content"]
    assert [m["role"] for m in first["messages"]].count("system") == 1
    # The calls went back to the model as calls with their results.
    second = fake_llm.requests[1]["messages"]
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "tool"]
    assert not fake_llm.refusals


async def test_a_reply_that_is_not_the_schema_stays_text(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """A server that ignores the schema: the text is the answer."""
    service = make_service()
    service.model = ModelSettings(constrain_tool_calls=True)
    fake_llm.script(text_reply("The sum is 3."))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add 1 and 2")
    assert result.status == TurnStatus.COMPLETED and result.answer == "The sum is 3."


@pytest.mark.parametrize(("content", "read"), [
    ('{"answer": "hi"}', ("hi", [])),
    ('{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}', (None, [("add", '{"a": 1}')])),
    ('{"tool_calls": [{"name": "add", "arguments": "{\\"a\\": 1}"}]}',
     (None, [("add", '{"a": 1}')])),
    ('{"tool_calls": []}', None),
    ('{"tool_calls": [{"arguments": {}}]}', None),
    ("hi", None),
    ("[1]", None),
])
def test_reading_a_reply(content: str, read: Any) -> None:
    assert read_reply(content) == read


def test_the_schema_is_the_grammar_dialect() -> None:
    tool = ToolSpec(name="t", description="", parameters={
        "type": "object", "properties": {"d": {"type": "string", "format": "date",
                                               "maxLength": 5000}}, "required": ["d"]})
    schema = reply_schema([tool])
    args = schema["anyOf"][1]["properties"]["tool_calls"]["items"]["anyOf"][0][
        "properties"]["arguments"]
    assert "format" not in args["properties"]["d"] and "maxLength" not in args["properties"]["d"]
    assert args["required"] == ["d"]


def _branches(request: dict[str, Any]) -> tuple[bool, list[str]]:
    """(the reply may be an answer, the tools it may call) of a request."""
    schema = request["response_format"]["schema"]
    options = schema.get("anyOf", [schema])
    answer = any("answer" in o["properties"] for o in options)
    calls = [c["properties"]["name"]["enum"][0]
             for o in options if "tool_calls" in o["properties"]
             for c in o["properties"]["tool_calls"]["items"]["anyOf"]]
    return answer, calls


@pytest.mark.parametrize(("choice", "answer_first", "only_add_first"), [
    ("required", False, False),
    ("add", False, True),
    ("auto", True, False),
])
async def test_tool_choice_shapes_the_first_schema(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer,
        choice: str, answer_first: bool, only_add_first: bool) -> None:
    """A 1.5B model offered "an answer or calls" answered at once, making up
    its figures (llama-server, 10 of 10 runs): `tool_choice` "required" (or a
    tool's name) leaves the answer out of the first request's schema, so its
    reply is a call; later requests offer the answer again."""
    service = make_service()
    service.model = ModelSettings(constrain_tool_calls=True, tool_choice=choice)
    fake_llm.script(
        constrained({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}),
        constrained({"answer": "3"}))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add 1 and 2")
    assert result.status == TurnStatus.COMPLETED and result.answer == "3", result.error
    offered = [_branches(r) for r in fake_llm.requests]
    assert offered[0][0] is answer_first
    assert (offered[0][1] == ["add"]) is only_add_first and "add" in offered[0][1]
    assert offered[1][0] is True and "add" in offered[1][1] and "echo" in offered[1][1]
    assert all("tool_choice" not in r and "tools" not in r for r in fake_llm.requests)


def test_tool_choice_none_leaves_only_the_answer() -> None:
    tool = ToolSpec(name="t", description="", parameters={"type": "object", "properties": {}})
    assert reply_schema([tool], tool_choice="none") == {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    named = {"type": "function", "function": {"name": "elsewhere"}}
    assert reply_schema([tool], tool_choice=named) == reply_schema([tool])


PEG_500 = ('{"error":{"code":500,"message":"The model produced output that does not match '
           'the expected peg-native format","type":"server_error"}}')


async def test_a_reply_the_server_cannot_parse_ends_the_turn_at_once(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """llama-server's 500 for output its parser cannot read (a constrained
    reply cut at max_tokens) is `ModelOutputUnparsed`: one request, the turn
    `failed` naming the server's message; not a 5xx outage retried for the
    model call's retry window."""
    service = make_service()
    service.model = ModelSettings(constrain_tool_calls=True)
    fake_llm.script(RawReply(500, PEG_500), constrained({"answer": "never asked"}))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add 1 and 2")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "ModelOutputUnparsed"
    assert "peg-native format" in result.error.message
    assert len(fake_llm.requests) == 1


@pytest.mark.parametrize("constrain", [True, False])
async def test_one_call_per_reply(client: Client, task_queue: str, tmp_path: Path,
                                  fake_llm: FakeOpenAIServer, constrain: bool) -> None:
    """`parallel_tool_calls=False`: constrained, the schema allows one call
    per reply (a 1.5B model wrote the query and the e-mail in one reply, the
    e-mail's body a template, before any result was known); with `tools`,
    the request says `parallel_tool_calls: false`. The default sends neither."""
    for parallel in (False, True):
        fake_llm.reset()
        service = make_service()
        service.model = ModelSettings(constrain_tool_calls=constrain, parallel_tool_calls=parallel)
        fake_llm.script(constrained({"answer": "3"}))
        async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t{parallel}.db",
                                  [service], llm_url=fake_llm.url) as turns:
            result = await turns.run("add 1 and 2")
        assert result.status == TurnStatus.COMPLETED, result.error
        request = fake_llm.requests[0]
        if constrain:
            schema = request["response_format"]["schema"]
            calls = next(o for o in schema["anyOf"] if "tool_calls" in o["properties"])
            assert calls["properties"]["tool_calls"].get("maxItems") == (None if parallel else 1)
        else:
            assert request.get("parallel_tool_calls", True) is parallel
    assert ModelSettings().model_dump() == ModelSettings(parallel_tool_calls=True).model_dump()
    assert "parallel_tool_calls" not in ModelSettings().model_dump()


async def test_tool_choice_for_two_rounds(client: Client, task_queue: str, tmp_path: Path,
                                          fake_llm: FakeOpenAIServer) -> None:
    """`tool_choice_rounds=2`: the first two requests of the turn leave the
    answer out (a 1.5B model answered after the query, inventing the
    e-mail's taskId, instead of calling createEmailTask); the third offers it."""
    service = make_service()
    service.model = ModelSettings(constrain_tool_calls=True, tool_choice="required",
                                  tool_choice_rounds=2)
    fake_llm.script(
        constrained({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}),
        constrained({"tool_calls": [{"name": "echo", "arguments": {"text": "3"}}]}),
        constrained({"answer": "3"}))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add 1 and 2, then echo it")
    assert result.status == TurnStatus.COMPLETED and result.answer == "3", result.error
    assert [_branches(r)[0] for r in fake_llm.requests] == [False, False, True]
    assert "tool_choice_rounds" not in ModelSettings().model_dump()
    with pytest.raises(ValueError):
        ModelSettings(tool_choice_rounds=0)
