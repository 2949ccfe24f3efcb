"""Property: whatever text a model writes, reading it for calls written as
text (turnstile.engine.answer_rules, used by workflow code for
`ToolCallAsText` and by the model activity for `text_tool_calls`) never
raises, returns only offered tools with arguments that are JSON, and finds
exactly the calls a model wrote in any of the forms it is known to use."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings, strategies as st

from turnstile.engine.answer_rules import calls_written_as_text, tool_call_as_text

OFFERED = ["querySalesData", "createEmailTask"]
NAMES = st.sampled_from([*OFFERED, "launchRockets", "", "functions", "a b"])
SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
ARGS = st.dictionaries(st.text(max_size=8), st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8), max_size=4)


def written(name: str, args: dict[str, Any], form: int) -> str:
    body = json.dumps(args)
    return [
        json.dumps({"name": name, "arguments": args}),
        "```json\n" + json.dumps({"name": name, "arguments": args}) + "\n```",
        "<tool_call>" + json.dumps({"name": name, "arguments": body}) + "</tool_call>",
        f"<function name=\"{name}\" arguments='{body}'/>",
        f"functions.{name}:\n{body}",
    ][form]


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=400) | st.builds(
    lambda parts: "".join(parts),
    st.lists(st.sampled_from(["```json\n", "```", "<tools>", "</tools>", "<tool_call>",
                              "functions.createEmailTask:", "<function=querySalesData>",
                              '{"name": "createEmailTask", "arguments": ', "{", "}", "[",
                              "\n", "text"]), max_size=20)))
def test_any_text_is_read_without_error_and_names_only_offered_tools(text: str) -> None:
    calls = calls_written_as_text(text, OFFERED)
    assert all(name in OFFERED for name, _ in calls)
    for _, arguments in calls:
        json.loads(arguments)
    assert tool_call_as_text(text, OFFERED) == (calls[0][0] if calls else None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(NAMES, ARGS), min_size=1, max_size=3),
       st.integers(min_value=0, max_value=4), st.booleans())
def test_calls_written_in_a_known_form_are_found(calls: list[tuple[str, dict[str, Any]]],
                                                 form: int, fenced_in_tools: bool) -> None:
    if form == 4:  # functions.NAME: has no room for names a tool cannot have
        calls = [(n, a) for n, a in calls if n.replace("_", "").isalnum()] or [(OFFERED[0], {})]
    text = "\n".join(written(n, a, form) for n, a in calls)
    if fenced_in_tools and form in (0, 3):
        text = f"<tools>\n{text}\n</tools>"
    found = calls_written_as_text(text, OFFERED)
    expected = [(n, a) for n, a in calls if n in OFFERED]
    assert [(n, json.loads(a)) for n, a in found] == expected
