"""The repeat breaker's comparison key (turnstile.engine.equivalence):
generated rewordings of one call — case of an address, surrounding
whitespace, NFC against NFD, an optional default written out, a set's order
and duplicates, key order — give the key of the call; generated real
differences — another recipient's local part, another word of the subject,
another number — give another key. On the sales tools as declared
(createEmailTask, createFollowUpTask) and on a tool with optional fields."""

from __future__ import annotations

import json
import unicodedata
from typing import Annotated, Any

from hypothesis import given, settings, strategies as st

from turnstile import tool
from turnstile.engine.equivalence import (
    AS_SET,
    EMAIL_ADDRESS,
    VERBATIM,
    Equivalence,
    comparison_key,
    normal_text,
)
from turnstile.runtime.tools import Tool
from turnstile.sales.sales_tools import createEmailTask, createFollowUpTask

EXAMPLES = 60  # per property; `python -m bench.repeat_keys` runs many more
Address = Annotated[str, EMAIL_ADDRESS]


@tool
def notify(to: Address, subject: str, cc: Annotated[tuple[Address, ...], AS_SET] = (),
           priority: int = 1, urgent: bool = False, code: Annotated[str, VERBATIM] = "") -> str:
    """A tool with optional fields, a set of addresses and a verbatim field."""
    return "sent"


LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Words with letters that have an NFD form (é = e + U+0301, Å = A + U+030A).
WORD_CHARS = LETTERS + "éüÅñç"
locals_ = st.text(LETTERS + "0123456789._-", min_size=1, max_size=12).filter(
    lambda s: s[0].isalnum())
domains = st.lists(st.text(LETTERS, min_size=1, max_size=8), min_size=1, max_size=3).map(
    lambda parts: ".".join([*parts, "com"]))
addresses = st.builds(lambda local, domain: f"{local}@{domain}", locals_, domains)
words = st.text(WORD_CHARS, min_size=1, max_size=8)
subjects = st.lists(words, min_size=1, max_size=6).map(" ".join)


@st.composite
def notify_calls(draw: st.DrawFn) -> dict[str, Any]:
    """A call of `notify`: optional fields sometimes left out."""
    args: dict[str, Any] = {"to": draw(addresses), "subject": draw(subjects)}
    if draw(st.booleans()):
        args["cc"] = draw(st.lists(addresses, max_size=4))
    if draw(st.booleans()):
        args["priority"] = draw(st.integers(-1000, 1000))
    if draw(st.booleans()):
        args["urgent"] = draw(st.booleans())
    return args


def recase(draw: st.DrawFn, text: str) -> str:
    return "".join(c.upper() if draw(st.booleans()) else c for c in text)


def pad(draw: st.DrawFn, text: str, blanks: str = " \t") -> str:
    space = st.text(blanks, max_size=3)
    return draw(space) + text + draw(space)


def nfd(draw: st.DrawFn, text: str) -> str:
    return unicodedata.normalize("NFD", text) if draw(st.booleans()) else text


def reword_address(draw: st.DrawFn, address: str, blanks: str = " \t") -> str:
    return pad(draw, recase(draw, address), blanks) if blanks else recase(draw, address)


@st.composite
def reworded(draw: st.DrawFn, args: dict[str, Any], defaults: dict[str, Any],
             sets: tuple[str, ...] = (), addresses_in: tuple[str, ...] = ("to",),
             blanks: str = " \t", address_blanks: str = " \t") -> str:
    """The same call written another way (raw JSON): `blanks` pad the
    subject, `address_blanks` the addresses."""
    out = dict(args)
    for name in addresses_in:
        if isinstance(out.get(name), str):
            out[name] = reword_address(draw, out[name], address_blanks)
    if isinstance(out.get("subject"), str):
        out["subject"] = pad(draw, nfd(draw, out["subject"]), blanks)
    for name in sets:
        items = list(out.get(name, []))
        if items:
            items = items + draw(st.lists(st.sampled_from(items), max_size=3))
            items = draw(st.permutations(items))
            out[name] = [reword_address(draw, i, address_blanks) if "@" in i else i
                         for i in items]
    for name, value in defaults.items():
        if name not in out and draw(st.booleans()):
            out[name] = value  # the default, written out
    keys = draw(st.permutations(list(out)))
    return json.dumps({k: out[k] for k in keys}, ensure_ascii=draw(st.booleans()))


def key(t: Tool, raw: str | dict[str, Any]) -> str:
    text = raw if isinstance(raw, str) else json.dumps(raw)
    return t.repeat_key(t.parse_arguments(text))


NOTIFY_DEFAULTS = {"cc": [], "priority": 1, "urgent": False, "code": ""}


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
@given(st.data(), notify_calls())
def test_rewordings_of_a_call_have_its_key(data: st.DataObject, args: dict[str, Any]) -> None:
    again = data.draw(reworded(args, NOTIFY_DEFAULTS, sets=("cc",)))
    assert key(notify, again) == key(notify, args), (args, again)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
@given(st.data(), notify_calls())
def test_real_differences_change_the_key(data: st.DataObject, args: dict[str, Any]) -> None:
    local, domain = args["to"].split("@")
    other_local = data.draw(locals_.filter(lambda s: s.casefold() != local.casefold()))
    words_ = args["subject"].split(" ")
    i = data.draw(st.integers(0, len(words_) - 1))
    other_word = data.draw(words.filter(lambda w: normal_text(w) != normal_text(words_[i])))
    changed = [
        {**args, "to": f"{other_local}@{domain}"},
        {**args, "subject": " ".join([*words_[:i], other_word, *words_[i + 1:]])},
        {**args, "priority": args.get("priority", 1) + data.draw(
            st.integers(1, 10 ** 6) | st.integers(-10 ** 6, -1))},
    ]
    original = key(notify, args)
    for other in changed:
        assert key(notify, other) != original, other


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
@given(st.data(), addresses, subjects, st.text(WORD_CHARS + " ", min_size=1, max_size=40)
       .filter(str.strip))
def test_createEmailTask_is_compared_by_meaning(data: st.DataObject, to: str, subject: str,
                                                body: str) -> None:
    """As the sales tool declares it: the address without case, subject and
    body NFC and trimmed; another recipient or subject is another e-mail.
    (Its validation refuses a tab in a subject and blanks around an address.)"""
    args = {"to": to, "subject": subject, "body": body}
    again = data.draw(reworded(args, {}, blanks=" ", address_blanks=""))
    assert key(createEmailTask, again) == key(createEmailTask, args)
    local, domain = to.split("@")
    other = data.draw(locals_.filter(lambda s: s.casefold() != local.casefold()))
    assert key(createEmailTask, {**args, "to": f"{other}@{domain}"}) != key(createEmailTask, args)
    assert key(createEmailTask, {**args, "subject": subject + " again"}) != key(
        createEmailTask, args)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
@given(st.data(), st.lists(st.integers(0, 9999).map("C{:04d}".format), min_size=1,
                           max_size=6, unique=True))
def test_follow_up_customers_are_a_set(data: st.DataObject, ids: list[str]) -> None:
    args = {"customerIds": ids, "assignee": "sales", "note": "call them"}
    again = data.draw(reworded(args, {}, sets=("customerIds",), addresses_in=()))
    assert key(createFollowUpTask, again) == key(createFollowUpTask, args)
    fewer = {**args, "customerIds": ids[:-1] or ["C9999X"]}
    assert key(createFollowUpTask, fewer) != key(createFollowUpTask, args)


def test_the_issue_48_calls_are_one_effect() -> None:
    """The three calls of the finding: one e-mail, by meaning."""
    mail = {"to": "ops@example.com", "subject": "Follow up", "body": "C0001 and C0002"}
    keys = {key(createEmailTask, mail), key(createEmailTask, {**mail, "to": "OPS@example.com"}),
            key(createEmailTask, {**mail, "subject": "Follow up "})}
    assert len(keys) == 1


def test_undeclared_fields_count() -> None:
    """A model that keeps undeclared fields (an MCP tool's arguments) compares
    them too: another value is another call, spacing and key order are not."""
    from turnstile.runtime.mcp.toolset import MCPArguments

    def mcp_key(raw: str) -> str:
        return comparison_key("mcp_x", MCPArguments.model_validate(json.loads(raw)))

    assert mcp_key('{"path": "/a", "n": 1}') == mcp_key('{"n": 1, "path": " /a "}')
    assert mcp_key('{"path": "/a"}') != mcp_key('{"path": "/b"}')
    assert mcp_key('{"path": "/a"}') != mcp_key('{"path": "/a", "n": 1}')


def test_what_stays_different() -> None:
    """The known non-merges: verbatim fields keep their spaces, dots and
    +tags in a local part count, a tool's name is part of the key."""
    base = {"to": "a.b@x.com", "subject": "s"}
    assert key(notify, {**base, "code": " 1"}) != key(notify, {**base, "code": "1"})
    assert key(notify, {**base, "to": "ab@x.com"}) != key(notify, base)
    assert key(notify, {**base, "to": "a.b+1@x.com"}) != key(notify, base)
    assert key(notify, {**base, "to": "a.b@x.com."}) == key(notify, base)  # a root dot
    args = notify.parse_arguments(json.dumps(base))
    assert comparison_key("notify", args) != comparison_key("other", args)
    assert Equivalence() == Equivalence(text="trimmed", as_set=False)
