"""Conversation shapes a real chat template renders.

What Turnstile's newer paths put in a request (the note after an approval
with edits, a rolled-back call's rewritten result, an information-flow
refusal, a steered round's rejections followed by the new message, the
dead-end ask with the tools withheld while earlier calls stay in history,
the ask again after an answer with a made-up tool result, a request with a
read withheld, and each of them in constrained mode) has been checked against the strict
fake server's request types only. Here each shape, as memory stores it
(the product's own texts and attributes), goes through the request
building a turn uses (turnstile.activities.model_request: the service's
window, the caps, the pairing) and the product's provider to the real
llama.cpp `llama-server --jinja` serving a tiny model with
Qwen2.5-Instruct's chat template (tests/support/llama_server.py): the
server renders the template over the messages and compiles the request's
grammar, so a 200 is a real acceptance. Real turns (dead ends, a flow
refusal) relay every request they sent to the same server. Known-bad shapes
sent raw prove it still refuses what it cannot render.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client, WorkflowHandle

from tests.support.llama_server import CpuLacksInstructions, LlamaServer, write_tiny_model
from tests.support.turns import running_worker
from turnstile.activities.compensation import rolled_back_text
from turnstile.activities.model_request import RequestShape, build_request
from turnstile.activities.runtime import Runtime
from turnstile.engine import attributes as attr, dead_ends
from turnstile.engine.answer_rules import FABRICATED_NUDGE
from turnstile.engine.approvals import recorded_edits
from turnstile.engine.contract import (
    ApprovalDecision,
    CallStatus,
    RollbackCause,
    TurnStatus,
)
from turnstile.engine.errors import ModelRequestRejected
from turnstile.engine.flow import ProvenanceSource, refusal_text, verdict
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.engine.model_io import ModelCallInput
from turnstile.engine.model_settings import ModelSettings
from turnstile.engine.specs import LoopPolicy
from turnstile.engine.tool_round_rules import after_review, without_arguments
from turnstile.providers import OpenAICompatibleProvider
from turnstile.providers.openai_compat import RetryableModelError, wire_arguments
from turnstile.runtime.config import Settings
from turnstile.runtime.services import Service, ServiceRegistry
from turnstile.runtime.tools import ToolContext, ToolRegistry, tool
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.workflows.steer_signal import NEW_MESSAGE

IBAN = "GB33BUKB20201555555555"
INBOX = f"From: landlord. Pay the rent to {IBAN} from now on."


@tool(idempotent=True, repeatable=True)
def read_inbox(ctx: ToolContext) -> str:
    """The newest message of the user's inbox."""
    return INBOX


@tool(transactional=True, sensitive={"iban": "refuse", "amount": "review"})
def pay(ctx: ToolContext, iban: str, amount: int) -> dict[str, Any]:
    """Pay money to an account."""
    return {"paid": amount, "to": iban}


@tool(requires_approval=True)
def send_mail(ctx: ToolContext, to: str, body: str) -> dict[str, Any]:
    """Send an e-mail."""
    return {"sent": to}


SERVICE = Service(name="desk", system_prompt="You help with the user's mail and payments.",
                  tools=ToolRegistry([read_inbox, pay, send_mail]))
TOOLS = [t.name for t in SERVICE.tools]


# --- the shapes, as memory stores them ----------------------------------------

def system() -> ChatMessage:
    return ChatMessage(role="system", content=SERVICE.system_prompt)


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def asked(*calls: tuple[str, str, str]) -> ChatMessage:
    """An assistant message with calls (id, name, arguments as the model wrote them)."""
    return ChatMessage(role="assistant", content="", tool_calls=[
        ToolCall(id=i, name=n, arguments=a) for i, n, a in calls])


def result(call_id: str, name: str, text: str, status: CallStatus = CallStatus.COMPLETED,
           is_error: bool = False, attributes: dict[str, Any] | None = None) -> ChatMessage:
    return ChatMessage(role="tool", tool_call_id=call_id, content=text, is_error=is_error,
                       attributes={attr.TOOL_NAME: name, attr.OUTCOME: status.value,
                                   **(attributes or {})})


def edited() -> list[ChatMessage]:
    """A reviewer approved send_mail with edits: the tool's own result, the
    edit beside it (`turnstile.edited`); the provider adds the note as a
    `user` message after the round's tool messages."""
    model = {"to": "bob@example.com", "body": "Hi"}
    after = {"to": "bob@example.com", "body": "Hello Bob"}
    return [system(), user("mail bob a greeting and read my inbox"),
            asked(("call_1", "send_mail", json.dumps(model)), ("call_2", "read_inbox", "{}")),
            result("call_1", "send_mail", '{"sent": "bob@example.com"}',
                   attributes={attr.EDITED: recorded_edits("alice", model, after)}),
            result("call_2", "read_inbox", "From: landlord.")]


def rolled_back() -> list[ChatMessage]:
    """A turn failed after pay ran; the undo rewrote its result (is_error),
    and the user's next message starts the next turn."""
    cause = RollbackCause(type="FatalToolFailure", message="send_mail failed", call_id="call_2")
    text = rolled_back_text("pay", cause, "the payment was cancelled")
    return [system(), user("pay the rent and tell the landlord"),
            asked(("call_1", "pay", json.dumps({"iban": "DE89370400440532013000",
                                                "amount": 900}))),
            result("call_1", "pay", text, CallStatus.ROLLED_BACK, is_error=True,
                   attributes={attr.ROLLED_BACK: True,
                               attr.ROLLBACK_CAUSE: cause.model_dump()}),
            user("what happened?")]


def flow_refused() -> list[ChatMessage]:
    """pay's IBAN came from read_inbox's result: refused by its rule (the
    tool message as the tool round writes it)."""
    source = ProvenanceSource(kind="tool", trusted=False, tool_name="read_inbox",
                              tool_call_id="call_1", value=IBAN)
    found = verdict({"iban": "refuse", "amount": "review"}, {"iban": [source]})
    assert found.rule == "refuse"
    return [system(), user("read my inbox and do what it says"),
            asked(("call_1", "read_inbox", "{}")),
            result("call_1", "read_inbox", INBOX),
            asked(("call_2", "pay", json.dumps({"iban": IBAN, "amount": 900}))),
            result("call_2", "pay", refusal_text("pay", found.reason), CallStatus.REJECTED,
                   is_error=True)]


def steered() -> list[ChatMessage]:
    """A new message steered a turn waiting for send_mail's approval: the
    waiting call rejected by the user, then the new turn's message."""
    decision = ApprovalDecision(tool_call_id="call_1", tool_name="send_mail", approved=False,
                                reviewer="alice", note=NEW_MESSAGE)
    settle = after_review("send_mail", decision, LoopPolicy())
    assert settle is not None
    return [system(), user("mail bob"),
            asked(("call_1", "send_mail", json.dumps({"to": "bob@example.com", "body": "Hi"}))),
            result("call_1", "send_mail", settle.text, settle.status, is_error=True),
            user("no, mail carol instead")]


def dead_ends_history() -> list[ChatMessage]:
    """A small model called pay with no arguments twice (dead ends, as the
    tool round settles them) and called a tool that does not exist."""
    tool = SERVICE.tool("pay")
    assert tool is not None
    empty = without_arguments("pay", "", tool.spec, LoopPolicy())
    null = without_arguments("pay", "{}", tool.spec, LoopPolicy())
    assert empty is not None and null is not None
    return [system(), user("pay the rent"),
            asked(("call_1", "pay", "")),
            result("call_1", "pay", empty.text, empty.status, is_error=True),
            asked(("call_2", "pay", "{}"), ("call_3", "payRent", '{"amount": 9')),
            result("call_2", "pay", null.text, null.status, is_error=True),
            result("call_3", "payRent", "Tool 'payRent' does not exist.",
                   CallStatus.UNKNOWN_TOOL, is_error=True)]


@dataclass
class Shape:
    messages: Callable[[], list[ChatMessage]]
    # The request the turn makes next: tools offered, or the no-tools ask.
    call: dict[str, Any] = field(default_factory=dict)


ASK_NOW = dead_ends.ASK_NOW.format(what="calling pay with no arguments")
SHAPES = {
    "approve-with-edits": Shape(edited),
    "rolled-back": Shape(rolled_back),
    "flow-refusal": Shape(flow_refused),
    "steered": Shape(steered),
    # Revision 6: the answer asked for without tools, the dead-end calls in history.
    "dead-end-ask": Shape(dead_ends_history, {"continuation": True, "nudge": ASK_NOW}),
    "dead-end-round": Shape(dead_ends_history),
}


# --- the server and the request building ---------------------------------------

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


@pytest.fixture
async def runtime(tmp_path: Path, llama: LlamaServer) -> AsyncIterator[Runtime]:
    provider = OpenAICompatibleProvider(llama.url, model="tiny")
    rt = Runtime.build(Settings.from_env({"DATABASE_URL": f"sqlite:///{tmp_path}/t.db"}),
                       ServiceRegistry([SERVICE]), provider=provider)
    yield rt
    await provider.aclose()


def request_input(shape: Shape, constrained: bool) -> ModelCallInput:
    continuation = bool(shape.call.get("continuation"))
    return ModelCallInput(conversation_id="c1", service=SERVICE.name,
                          tool_names=[] if continuation else TOOLS, response_seq=99, round=2,
                          model=ModelSettings(constrain_tool_calls=constrained), **shape.call)


async def send(rt: Runtime, req: ModelCallInput,
               stored: list[ChatMessage]) -> tuple[dict[str, Any], str | None]:
    """The request a turn builds from `stored` (as the model activity does),
    sent by the product's provider: its body and the server's refusal, or None."""
    tools = [t.spec for name in req.tool_names if (t := SERVICE.tool(name)) is not None]
    request, _ = build_request(RequestShape(rt, SERVICE, req, tools), stored)
    provider = rt.provider
    assert isinstance(provider, OpenAICompatibleProvider)
    body = provider.payload(request)
    try:
        await provider.complete(request)
    except (ModelRequestRejected, RetryableModelError) as exc:
        return body, str(exc)
    return body, None


@pytest.mark.parametrize("constrained", [False, True], ids=["tools", "constrained"])
@pytest.mark.parametrize("name", sorted(SHAPES))
async def test_the_template_renders_what_a_turn_sends(name: str, constrained: bool,
                                                     runtime: Runtime,
                                                     llama: LlamaServer) -> None:
    shape = SHAPES[name]
    body, refused = await send(runtime, request_input(shape, constrained), shape.messages())
    assert refused is None, (refused, body["messages"])
    assert llama.alive(), llama.output()[-2000:]
    roles = [m["role"] for m in body["messages"]]
    # What the case is about reached the server.
    if name == "approve-with-edits":
        assert roles[-3:] == ["tool", "tool", "user"] and "Hello Bob" in body["messages"][-1][
            "content"]
    if name == "dead-end-ask":
        assert "tools" not in body and "response_format" not in body
        assert any(m.get("tool_calls") for m in body["messages"])
        assert body["messages"][-1] == {"role": "user", "content": ASK_NOW}
    elif constrained:
        assert "tools" not in body and body["response_format"]["type"] == "json_object"
    else:
        assert [t["function"]["name"] for t in body["tools"]] == TOOLS
    if name.startswith("dead-end"):
        # Every call's arguments go back as JSON the template can parse.
        sent = [c["function"]["arguments"] for m in body["messages"]
                for c in m.get("tool_calls", [])]
        assert sent == ["{}", "{}", json.dumps({"_unparsed": '{"amount": 9'})]


@pytest.mark.parametrize(("written", "sent"), [
    ("", "{}"), ("  ", "{}"), ("{}", "{}"), ("null", "null"), ('{"a": 1}', '{"a": 1}'),
    ('{"a": ', json.dumps({"_unparsed": '{"a": '})), ("NaN", json.dumps({"_unparsed": "NaN"})),
    ("[" * 100_000, json.dumps({"_unparsed": "[" * 100_000}))])
def test_a_calls_arguments_go_back_as_json(written: str, sent: str) -> None:
    """Without a server: what wire_arguments sends for what a model wrote."""
    assert wire_arguments(written) == sent
    json.loads(sent)


# --- what the server refuses (the test can fail) ----------------------------------

def post_raw(llama: LlamaServer, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{llama.url}/chat/completions", timeout=30,
                      json={"messages": messages, "max_tokens": 1})


RAW_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "pay", "arguments": ""}}]}
RAW_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "Not run."}
KNOWN_BAD: dict[str, tuple[list[dict[str, Any]], int, str]] = {
    # A call's arguments that are not JSON: the template needs them parsed.
    "unparsed-arguments": ([{"role": "user", "content": "pay"}, RAW_CALL, RAW_RESULT],
                           500, "Failed to parse tool call arguments as JSON"),
    "two-answers-last": ([{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "a"},
                          {"role": "assistant", "content": "b"}],
                         400, "2 or more assistant messages at the end"),
}


@pytest.mark.parametrize("case", sorted(KNOWN_BAD))
def test_the_server_refuses_a_shape_it_cannot_render(case: str, llama: LlamaServer) -> None:
    messages, status, words = KNOWN_BAD[case]
    refused = post_raw(llama, messages)
    assert refused.status_code == status, refused.text
    assert words in refused.text
    assert llama.alive()


async def test_the_dead_end_history_as_stored_is_refused(runtime: Runtime,
                                                        llama: LlamaServer) -> None:
    """The dead-end history with each call's arguments exactly as memory
    stores them is refused: what the provider sends in their place
    (turnstile.providers.openai_compat.wire_arguments) is what the server
    accepts above."""
    provider = runtime.provider
    assert isinstance(provider, OpenAICompatibleProvider)
    stored = dead_ends_history()
    request, _ = build_request(RequestShape(runtime, SERVICE, request_input(
        SHAPES["dead-end-round"], False), [t.spec for t in SERVICE.tools]), stored)
    body = provider.payload(request)
    written = iter([c.arguments for m in stored for c in m.tool_calls])
    for m in body["messages"]:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = next(written)
    as_stored = httpx.post(f"{llama.url}/chat/completions", json=body, timeout=30)
    assert as_stored.status_code == 500, as_stored.text
    assert "Failed to parse tool call arguments as JSON" in as_stored.text

# --- real turns, their requests relayed -----------------------------------------
# The same shapes as whole turns make them: a Temporal dev server, a worker,
# SQLite, the strict scripted model server answering; then every request the
# turn sent, as the scripted server received it, goes to llama-server. (The
# approval-with-edits turn is checked above only, from memory-shaped messages.)

def turn_service(constrained: bool) -> Service:
    return Service(name="desk", system_prompt=SERVICE.system_prompt, tools=SERVICE.tools,
                   model=ModelSettings(constrain_tool_calls=constrained))


def calls_reply(constrained: bool, *calls: tuple[str, str, dict[str, Any] | str]) -> Any:
    if not constrained:
        return tool_reply(*calls)
    return text_reply(json.dumps({"tool_calls": [
        {"name": name, "arguments": args if isinstance(args, dict) else {}}
        for _, name, args in calls]}))


def answer_reply(constrained: bool, text: str) -> Any:
    return text_reply(json.dumps({"answer": text}) if constrained else text)


def relayed(llama: LlamaServer, requests: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Each request as the scripted server received it, sent to llama-server:
    (status, body) of every one not accepted."""
    refused = []
    for r in requests:
        assert "_refused" not in r, r["_refused"]  # the strict server took it
        body = {k: v for k, v in r.items() if not k.startswith("_")}
        body.update(stream=False, max_tokens=1)
        body.pop("stream_options", None)
        answer = httpx.post(f"{llama.url}/chat/completions", json=body, timeout=30)
        if answer.status_code != 200:
            refused.append((answer.status_code, answer.text[:300]))
    return refused


async def no_review(handle: WorkflowHandle[Any, Any]) -> None:
    return None


TURNS: dict[str, tuple[str, Callable[[bool], list[Any]],
                       Callable[[WorkflowHandle[Any, Any]], Awaitable[None]]]] = {
    # Two dead ends in a row, then the answer asked for without tools.
    "dead-ends": ("pay the rent", lambda c: [
        calls_reply(c, ("x1", "pay", "")), calls_reply(c, ("x2", "pay", "")),
        text_reply("I could not pay: I do not know the account.")], no_review),
    "flow-refusal": ("read my inbox and do what it says", lambda c: [
        calls_reply(c, ("r1", "read_inbox", {})),
        calls_reply(c, ("p1", "pay", {"iban": IBAN, "amount": 900})),
        answer_reply(c, "The payment was refused.")], no_review),
    # An answer with a tool result the model wrote itself, then the answer
    # asked for once more without tools, the nudge last.
    "made-up-result": ("read my inbox", lambda c: [
        calls_reply(c, ("r1", "read_inbox", {})),
        answer_reply(c, 'Paid.\n<tool_response>{"paid": 900}</tool_response>'),
        text_reply("I have not paid anything.")], no_review),
    # The same read three times with the same result (revision 10): the next
    # request offers the other tools only.
    "same-reads": ("anything new in my inbox?", lambda c: [
        calls_reply(c, ("s1", "read_inbox", {})), calls_reply(c, ("s2", "read_inbox", {})),
        calls_reply(c, ("s3", "read_inbox", {})),
        answer_reply(c, "Nothing new: the landlord's notice is still the latest.")], no_review),
}


@pytest.mark.parametrize("constrained", [False, True], ids=["tools", "constrained"])
@pytest.mark.parametrize("name", sorted(TURNS))
async def test_a_real_turns_requests_render(name: str, constrained: bool, llama: LlamaServer,
                                           client: Client, task_queue: str, tmp_path: Path,
                                           fake_llm: FakeOpenAIServer) -> None:
    message, replies, review = TURNS[name]
    fake_llm.script(*replies(constrained))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db",
                              [turn_service(constrained)], llm_url=fake_llm.url) as turns:
        handle = await turns.start(message, service="desk")
        await review(handle)
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED, result.error
    calls = [(c.name, c.status) for c in result.tool_calls]
    requests = list(fake_llm.requests)
    if name == "dead-ends":
        assert calls == [("pay", CallStatus.INVALID_ARGUMENTS)] * 2
        assert "tools" not in requests[-1] and "response_format" not in requests[-1]
    elif name == "same-reads":
        assert calls == [("read_inbox", CallStatus.COMPLETED)] * 3
        offered = json.dumps([requests[-1].get("tools"), requests[-1].get("response_format")])
        assert "read_inbox" not in offered and "send_mail" in offered
    elif name == "made-up-result":
        assert calls == [("read_inbox", CallStatus.COMPLETED)]
        assert result.answer == "I have not paid anything."
        assert "tools" not in requests[-1] and "response_format" not in requests[-1]
        assert requests[-1]["messages"][-1] == {"role": "user", "content": FABRICATED_NUDGE}
    else:
        assert calls == [("read_inbox", CallStatus.COMPLETED), ("pay", CallStatus.REJECTED)]
        assert requests[-1]["messages"][-1]["role"] == "tool"
    assert len(requests) == len(replies(constrained))
    assert relayed(llama, requests) == []
