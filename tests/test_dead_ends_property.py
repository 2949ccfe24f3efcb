"""Property: whatever sequence of dead-end and valid replies a
model gives — calls without the arguments their tool needs, calls of a tool
that does not exist, `functions.NAME:` written alone, calls that run, the
same read again (revision 10: its third identical answer withholds the
tool, whose later calls are dead ends), an answer — a real turn ends
(completed or a typed ending) within a bounded number of model requests,
exactly where the rule says (turnstile.engine.dead_ends: two dead-end
responses in a row, one request without tools, then an answer or
`DeadEndCalls`), and never at the round-trip cap when its last replies were
dead ends.

One worker (a real dev server, SQLite, the strict fake model server) serves
every example; each example is one turn. Few examples in CI; set
DEAD_END_EXAMPLES for more.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tests.support.loop_thread import LoopThread, hosted_worker
from tests.support.services import make_service
from tests.support.temporal_server import DevServer
from tests.support.turns import Turns
from turnstile.engine.contract import TurnStatus
from turnstile.engine.dead_ends import DEAD_END_AFTER
from turnstile.engine.repeats import ANSWER_AFTER
from turnstile.engine.specs import LoopPolicy
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

EXAMPLES = int(os.environ.get("DEAD_END_EXAMPLES", "12"))
CAP = 5  # the service's max_round_trips: small, so the cap is met too (7 replies)
KINDS = ("valid", "same_read", "no_arguments", "unknown", "bare_head", "answer")
DEAD = {"no_arguments", "unknown", "bare_head"}


def reply(kind: str, n: int) -> dict[str, Any]:
    return {
        "valid": lambda: tool_reply((f"a{n}", "add", {"a": 1, "b": n})),
        "same_read": lambda: tool_reply((f"s{n}", "add", {"a": 2, "b": 3})),
        "no_arguments": lambda: tool_reply((f"e{n}", "echo", {})),
        "unknown": lambda: tool_reply((f"x{n}", "launchRockets", {"count": n})),
        "bare_head": lambda: text_reply("functions.echo:"),
        "answer": lambda: text_reply(f"done after {n}"),
    }[kind]()


def expected(replies: list[str], ask: str) -> tuple[str, int]:
    """The rule, written plainly: (the ending, model requests). `ask` is what
    the model answers when asked without tools."""
    rounds = in_row = requests = same = 0
    withheld = False  # `add`, after its same read came back the same 3 times

    def asked() -> tuple[str, int]:
        return ("completed" if ask == "answer" else "DeadEndCalls"), requests + 1

    for kind in [*replies, "answer"]:
        requests += 1
        if kind == "answer":
            return "completed", requests
        if kind == "bare_head":  # an answer that is a dead end: no round trip
            in_row += 1
            if in_row >= DEAD_END_AFTER:
                return asked()
            continue
        rounds += 1
        dead = kind in DEAD or (withheld and kind in ("valid", "same_read"))
        if rounds > CAP:
            if dead and in_row + 1 >= DEAD_END_AFTER:
                return asked()
            return "RoundTripCapExceeded", requests
        if kind == "same_read" and not dead:
            same += 1
            withheld = same >= 1 + ANSWER_AFTER
        in_row = in_row + 1 if dead else 0
        if in_row >= DEAD_END_AFTER:
            return asked()
    raise AssertionError("unreachable: the list ends with an answer")




@pytest.fixture
def hosted(temporal_server: DevServer, fake_llm: FakeOpenAIServer,
           tmp_path: Path) -> Iterator[tuple[LoopThread, Turns]]:
    service = make_service()
    service.loop = LoopPolicy(max_round_trips=CAP)
    with hosted_worker(temporal_server.address, f"dead-{uuid.uuid4().hex[:8]}",
                       f"sqlite:///{tmp_path}/t.db", [service], llm_url=fake_llm.url) as hosting:
        yield hosting


def test_any_run_of_dead_ends_ends_the_turn_where_the_rule_says(
        hosted: tuple[LoopThread, Turns], fake_llm: FakeOpenAIServer) -> None:
    lt, turns = hosted

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.function_scoped_fixture])
    @given(replies=st.lists(st.sampled_from(KINDS), max_size=7),
           ask=st.sampled_from(["answer", "bare_head", "valid"]))
    # The read withheld, then called anyway (dead ends), or answered after.
    @example(replies=["same_read"] * 3 + ["valid", "same_read"], ask="answer")
    @example(replies=["same_read", "valid", "same_read", "same_read", "valid"], ask="valid")
    @example(replies=["same_read"] * 3 + ["valid", "valid"], ask="valid")  # DeadEndCalls
    @example(replies=["same_read"] * 3 + ["answer"], ask="answer")
    def one(replies: list[str], ask: str) -> None:
        seen: list[dict[str, Any]] = []
        queue = [*replies]

        def model(request: dict[str, Any]) -> dict[str, Any]:
            seen.append(request)
            if "tools" not in request:  # asked without tools
                return reply(ask, len(seen))
            return reply(queue.pop(0) if queue else "answer", len(seen))

        fake_llm.default = model
        result = lt.run(turns.run("go", conversation=f"c-{uuid.uuid4().hex[:8]}"), 120)
        ending, requests = expected(replies, ask)
        got = "completed" if result.status == TurnStatus.COMPLETED else (
            result.error.type if result.error else str(result.status))
        assert (got, len(seen)) == (ending, requests), (replies, ask, result.error)
        assert len(seen) <= len(replies) + 2  # bounded: one ask at most
        if got == "RoundTripCapExceeded":
            last = replies[:requests][-DEAD_END_AFTER:]
            assert not set(last) <= DEAD, (replies, ask)
        if got == "completed":
            assert result.answer.startswith("done after")
        assert not fake_llm.refusals

    one()
