"""The rules behind edited approvals and approval by condition, without a
server: the wire note's place, stored results of earlier releases, what a
function model sees, tool definitions refused by name, conditions that
raise (docs/approvals.md)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from turnstile.engine import attributes as attr
from turnstile.engine.approvals import edit_note, recorded_edits, split_edit_note
from turnstile.engine.errors import ModelFunctionError
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.providers.base import ModelRequest
from turnstile.providers.function_model import FunctionModel, model_call
from turnstile.providers.openai_compat import OpenAICompatibleProvider, with_edit_notes
from turnstile.runtime.tools import ToolContext, ToolDefinitionError, tool
from turnstile.stores.db import Database
from turnstile.testing.openai_conformance import violations

ASKED = {"member_id": "M-2", "book_id": "B-7"}
RAN = {"member_id": "M-3", "book_id": "B-7"}
RESULT = json.dumps({**RAN, "status": "OUT"})


def round_of(edited: bool, legacy: bool = False) -> list[ChatMessage]:
    calls = [ToolCall(id="l1", name="lendBook", arguments=json.dumps(ASKED)),
             ToolCall(id="f1", name="findBook", arguments="{}")]
    first = ChatMessage(role="tool", tool_call_id="l1", content=RESULT,
                        attributes={attr.TOOL_NAME: "lendBook"})
    if edited:
        first.attributes[attr.EDITED] = recorded_edits("bob", ASKED, RAN)
    if legacy:  # as 0.4 stored it: the note as the result's first line
        first.content = f"{edit_note('bob', ASKED, RAN)}\n{RESULT}"
    return [ChatMessage(role="system", content="desk"),
            ChatMessage(role="user", content="lend B-7 to M-2"),
            ChatMessage(role="assistant", content=None, tool_calls=calls),
            first,
            ChatMessage(role="tool", tool_call_id="f1", content='{"found": true}',
                        attributes={attr.TOOL_NAME: "findBook"})]


async def test_the_note_follows_the_rounds_results_as_a_message_of_its_own() -> None:
    sent = with_edit_notes(round_of(edited=True))
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert sent[3].content == RESULT  # the tool message is the tool's JSON
    assert "'bob' edited the arguments of your call l1 (lendBook)" in (sent[5].content or "")
    assert "member_id: 'M-2' -> 'M-3'" in (sent[5].content or "")
    provider = OpenAICompatibleProvider(base_url="http://127.0.0.1:1/v1", model="m")
    body = provider.payload(ModelRequest(messages=round_of(edited=True), tools=[]))
    await provider.aclose()
    assert violations(body) == []  # what a strict endpoint accepts
    unedited = round_of(edited=False)
    assert with_edit_notes(unedited) is unedited


def test_a_function_model_reads_the_result_and_the_edits_beside_it() -> None:
    seen = model_call(ModelRequest(messages=round_of(edited=True), tools=[]))
    loan = seen.result_of("lendBook")
    assert loan is not None and loan.result == {**RAN, "status": "OUT"}
    assert loan.text == RESULT and loan.arguments == ASKED
    assert loan.edits is not None and loan.edits.reviewer == "bob"
    assert loan.edits.arguments == RAN
    change = loan.edits.changes["member_id"]
    assert (change.before, change.after, change.added, change.removed) == ("M-2", "M-3",
                                                                           False, False)
    found = seen.result_of("findBook")
    assert found is not None and found.edits is None


def test_a_result_stored_with_the_old_note_reads_as_the_tools_result() -> None:
    seen = model_call(ModelRequest(messages=round_of(edited=False, legacy=True), tools=[]))
    loan = seen.result_of("lendBook")
    assert loan is not None and loan.result == {**RAN, "status": "OUT"}
    assert loan.edits is not None and loan.edits.reviewer == "bob"


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(reviewer=st.text(max_size=20), value=st.text(max_size=30),
       result=st.text(max_size=60))
def test_the_old_note_always_splits_off_whole(reviewer: str, value: str, result: str) -> None:
    note = edit_note(reviewer, {"a": "x"}, {"a": value})
    assert split_edit_note(f"{note}\n{result}") == (note, result)
    assert split_edit_note(result)[1] == result


class Shelf:  # not a type pydantic can validate or describe
    pass


def test_a_parameter_of_an_unsupported_type_is_refused_by_name() -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        @tool
        def shelveBook(book_id: str, shelf: Shelf) -> str:
            """Put a book on a shelf."""
            return book_id
    assert "tool shelveBook: parameter 'shelf' has type Shelf" in str(refused.value)
    assert isinstance(refused.value, TypeError)  # as before 0.5


def test_a_tool_without_a_description_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="turnstile.runtime.tools"):
        @tool
        def silentTool(x: int) -> int:
            return x
    assert "tool silentTool has no description" in caplog.text
    assert silentTool.spec.description == "silentTool"


def test_approval_takes_a_function_and_not_with_requires_approval() -> None:
    with pytest.raises(ToolDefinitionError, match="give one of them"):
        @tool(requires_approval=True, approval=lambda args: None)
        def both(x: int) -> int:
            """Both."""
            return x
    with pytest.raises(ToolDefinitionError, match="takes a function"):
        @tool(approval="always")  # type: ignore[typeddict-item]
        def words(x: int) -> int:
            """Words."""
            return x


def above(args: Any) -> str | None:
    return f"{args.amount} is above 100" if args.amount > 100 else None


@tool(approval=above)
def pay(amount: int) -> int:
    """Pay an amount."""
    return amount


def raising(ctx: ToolContext, args: Any) -> str | None:
    raise LookupError("no such member")


@tool(approval=raising)
def payLater(amount: int) -> int:
    """Pay an amount later."""
    return amount


async def test_a_condition_says_why_or_nothing_and_a_raising_one_asks(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    ctx = ToolContext(db=Database(f"sqlite:///{tmp_path}/x.db"), workflow_id="w",
                      conversation_id="c", user_id="u", tool_call_id="t")
    assert pay.spec.approval_condition and not pay.spec.requires_approval
    assert await pay.approval_reason(ctx, pay.parse_arguments('{"amount": 5}')) is None
    assert await pay.approval_reason(ctx, pay.parse_arguments('{"amount": 500}')) == \
        "500 is above 100"
    with caplog.at_level(logging.ERROR, logger="turnstile.runtime.tools"):
        said = await payLater.approval_reason(ctx, payLater.parse_arguments('{"amount": 1}'))
    assert said == "the approval condition of payLater raised LookupError: no such member"
    assert "raising" in caplog.text  # the traceback names the user's condition
    # Recorded specs of other tools read as before: the flag is left out when False.
    assert "approval_condition" not in tool(lambda: 1).spec.model_dump(  # type: ignore[arg-type]
        exclude_defaults=False, mode="json")


async def test_a_reply_of_no_known_kind_is_a_model_function_error() -> None:
    model = FunctionModel(lambda request: None, name="nothing")  # type: ignore[arg-type,return-value]
    with pytest.raises(ModelFunctionError, match="a model function returns a str"):
        await model.complete(ModelRequest(messages=[ChatMessage(role="user", content="hi")]))
