"""What the model request carries on the wire, through real turns
against the scripted server on a real socket: content "" beside tool calls
(the server refuses null as llama-cpp-python does), tool schemas in the
chosen dialect while the tool still validates with the full schema, and the
service's model settings, on the wire and in the turn's history."""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
import pytest
from pydantic import Field
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.support.services import add, make_service
from tests.support.turns import running_worker
from turnstile import ModelSettings, Service, ToolRegistry, tool
from turnstile.engine.contract import TurnStatus
from turnstile.engine.model_settings import SchemaDialect
from turnstile.sales.documents import SALES_DOCUMENTS
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}


def _conversation(content: str | None) -> dict[str, Any]:
    return {"model": "m", "messages": [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": content, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"}]}


def test_the_scripted_server_refuses_null_content_beside_tool_calls(
        fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(text_reply("2"))
    refused = httpx.post(f"{fake_llm.url}/chat/completions", json=_conversation(None))
    assert refused.status_code == 500
    assert "Input should be a valid string" in refused.json()["error"]["message"]
    assert fake_llm.refusals == ["messages[1].content is null beside tool_calls"]
    taken = httpx.post(f"{fake_llm.url}/chat/completions", json=_conversation(""))
    assert taken.status_code == 200, taken.text
    assert taken.json()["choices"][0]["message"]["content"] == "2"


async def test_a_tool_round_sends_empty_content_beside_its_calls(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("c1", "add", {"a": 1, "b": 1})), text_reply("2"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [make_service()], llm_url=fake_llm.url) as turns:
        result = await turns.run("1+1?")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert fake_llm.refusals == []
    assistant = [m for m in fake_llm.requests[1]["messages"] if m["role"] == "assistant"]
    assert assistant[-1]["content"] == "" and assistant[-1]["tool_calls"][0]["id"] == "c1"


@tool(idempotent=True)
def saveNote(text: Annotated[str, Field(min_length=1, max_length=5000, description="the note")],
             code: Annotated[str, Field(pattern=r"^[A-Z]{2}$")]) -> dict[str, int]:
    """Save a note under a two-letter code."""
    return {"saved": len(text)}


@pytest.mark.parametrize(("env_dialect", "service_dialect", "sent"), [
    (None, None, "grammar"),  # the default
    ("full", None, "full"),  # LLM_SCHEMA_DIALECT
    ("full", "grammar", "grammar"),  # the service's choice wins
])
async def test_tool_schemas_go_out_in_the_chosen_dialect_and_the_tool_checks_the_full_one(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,
        env_dialect: SchemaDialect | None, service_dialect: SchemaDialect | None,
        sent: SchemaDialect) -> None:
    service = Service(name="notes", tools=ToolRegistry([saveNote]),
                      model=ModelSettings(schema_dialect=service_dialect))
    fake_llm.script(tool_reply(("c1", "saveNote", {"text": "x" * 6000, "code": "AB"})),
                    tool_reply(("c2", "saveNote", {"text": "short", "code": "AB"})),
                    text_reply("saved"))
    env = {"LLM_SCHEMA_DIALECT": env_dialect} if env_dialect else {}
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url, env=env) as turns:
        result = await turns.run("save a long note", service="notes")
    assert result.status == TurnStatus.COMPLETED, result.error
    props = fake_llm.requests[0]["tools"][0]["function"]["parameters"]["properties"]
    if sent == "grammar":
        assert props["text"] == {"minLength": 1, "type": "string",
                                 "description": "the note (at most 5000 characters)"}
        assert props["code"] == {"type": "string"}
    else:
        assert props["text"]["maxLength"] == 5000 and props["code"]["pattern"] == "^[A-Z]{2}$"
    # Whatever was sent, the tool validated the arguments with its full schema.
    first_result = next(m for m in fake_llm.requests[1]["messages"]
                        if m["role"] == "tool" and m["tool_call_id"] == "c1")
    assert "at most 5000 characters" in first_result["content"]
    second_result = next(m for m in fake_llm.requests[2]["messages"]
                         if m["role"] == "tool" and m["tool_call_id"] == "c2")
    assert json.loads(second_result["content"]) == {"saved": 5}


async def _recorded_payloads(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    """Every JSON payload of the turn's markers and scheduled activities."""
    found: list[Any] = []
    for e in (await handle.fetch_history()).events:
        payloads = []
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            for details in e.marker_recorded_event_attributes.details.values():
                payloads += details.payloads
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            payloads += e.activity_task_scheduled_event_attributes.input.payloads
        for p in payloads:
            try:
                found.append(json.loads(p.data))
            except ValueError:
                continue
    return found


async def test_model_settings_go_on_the_wire_and_into_history(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    settings = ModelSettings(max_tokens=256, temperature=0.1, tool_choice="add")
    service = make_service("tuned")
    service.model = settings
    fake_llm.script(tool_reply(("c1", "add", {"a": 1, "b": 1})), text_reply("2"),
                    text_reply("plain"))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [service, make_service()], llm_url=fake_llm.url) as turns:
        handle = await turns.start("1+1?", service="tuned")
        result = await handle.result()
        plain = await turns.run("hello", service="test", conversation="c-plain")
    assert result.status == TurnStatus.COMPLETED and plain.status == TurnStatus.COMPLETED
    first, second, other = fake_llm.requests
    assert first["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert second["tool_choice"] == "auto"  # the first round only
    for request in (first, second):
        assert (request["max_tokens"], request["temperature"]) == (256, 0.1)
    assert other["tool_choice"] == "auto"
    assert "max_tokens" not in other and "temperature" not in other
    recorded = await _recorded_payloads(handle)
    specs = [p["spec"] for p in recorded if isinstance(p, dict) and "spec" in p]
    assert specs and specs[0]["model"] == {"max_tokens": 256, "temperature": 0.1,
                                           "tool_choice": "add"}
    inputs = [p for p in recorded if isinstance(p, dict) and "response_seq" in p]
    assert len(inputs) == 2 and all(p["model"] == specs[0]["model"] for p in inputs)


@pytest.mark.parametrize(("settings", "lead_in"), [
    (ModelSettings(), "Answer using the following information"),
    (ModelSettings(retrieval_lead_in="Policies:"), "Policies:"),
    (ModelSettings(documents=False), None),
])
async def test_the_compact_prompt_sets_the_lead_in_or_leaves_documents_out(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer,
        settings: ModelSettings, lead_in: str | None) -> None:
    service = Service(name="docs", tools=ToolRegistry([add]), documents=SALES_DOCUMENTS,
                      model=settings)
    fake_llm.script(text_reply("ok"))
    message = "Find customers whose sales last week exceeded 50,000 and follow up"
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [service],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run(message, service="docs")
    assert result.status == TurnStatus.COMPLETED, result.error
    user = [m for m in fake_llm.requests[0]["messages"] if m["role"] == "user"][-1]
    if lead_in is None:
        assert user["content"] == message
    else:
        assert user["content"].startswith(message + "\n\n" + lead_in)
        assert len(user["content"]) > len(message) + len(lead_in) + 10  # documents follow
