"""The approver and outbound rules as pure functions, table-driven."""

from __future__ import annotations

import json

import pytest

from turnstile.engine.approvals import (
    ApprovalPolicy,
    NameRule,
    OutboundPolicy,
    approval_refusal,
    outbound_findings,
)
from turnstile.engine.errors import ToolArgumentError
from turnstile.sales.sales_tools import createEmailTask

OPEN = ApprovalPolicy()
NARROW = ApprovalPolicy(reviewers={"createEmailTask": ["ops-lead"], "*": ["admin"]})
SELF_OK = ApprovalPolicy(allow_self_approval=True)


@pytest.mark.parametrize(("policy", "tool", "reviewer", "expected"), [
    (OPEN, "createEmailTask", "bob", None),
    (OPEN, "createEmailTask", "alice", "'alice' requested this call and may not decide it"),
    (OPEN, "createEmailTask", "  ", "a decision needs a named reviewer"),
    (SELF_OK, "createEmailTask", "alice", None),
    (NARROW, "createEmailTask", "ops-lead", None),
    (NARROW, "createEmailTask", "admin", "'admin' is not an approver of createEmailTask"),
    (NARROW, "createFollowUpTask", "admin", None),  # "*" covers tools without an entry
    (NARROW, "createFollowUpTask", "bob", "'bob' is not an approver of createFollowUpTask"),
    (NARROW, "createEmailTask", "alice", "'alice' requested this call"),  # never self
    # identities, not spellings (turnstile.engine.identity)
    (OPEN, "createEmailTask", "Alice", "'Alice' requested this call"),
    (OPEN, "createEmailTask", "ＡＬＩＣＥ", "'\\uff21"),
    (OPEN, "createEmailTask", "al\u200bice", "'al\\u200bice' requested this call"),
    (OPEN, "createEmailTask", "\u200b\u200d", "a decision needs a named reviewer"),
    (NARROW, "createEmailTask", "OPS-LEAD", None),
    (NARROW, "createEmailTask", "ops\u2011lead", "'ops\\u2011lead' is not a valid name"),
    # confusables (UTS #39): the requester's look-alike may not decide; an
    # approver's look-alike is not that approver
    (OPEN, "createEmailTask", "\u0430lice", "'\\u0430lice' is confusable with the requester"),
    (OPEN, "createEmailTask", "al\u200dice", "'al\\u200dice' requested this call"),
    (NARROW, "createEmailTask", "\u043eps-lead", "'\\u043eps-lead' is not an approver"),
    (NARROW, "createEmailTask", "0ps-lead", "'0ps-lead' is not an approver"),
    (NARROW, "createEmailTask", "\uff2f\uff30\uff33-lead", None),  # full-width: same identity
    (OPEN, "createEmailTask", "b\u2603b", "'b\\u2603b' is not a valid name"),
    # case-blind: a look-alike of the requester in capitals (docs/identity.md)
    (OPEN, "createEmailTask", "\u0410LICE", "'\\u0410LICE' is confusable with the requester"),
    (OPEN, "createEmailTask", "AL\u0130CE", "'AL\\u0130CE' is confusable with the requester"),
    (OPEN, "createEmailTask", "\u0391L\u0399C\u0395", "'\\u0391L\\u0399C\\u0395' is confusable"),
    (NARROW, "createEmailTask", "\u041ePS-LEAD", "'\\u041ePS-LEAD' is not an approver"),
    # only text is a name: never read as the name without what is not text
    (OPEN, "createEmailTask", "b\ud800ob", "'b\\ud800ob' is not a valid name (it holds U+D800"),
    (NARROW, "createEmailTask", "ops-lead\udcff", "'ops-lead\\udcff' is not a valid name"),
    (NARROW, "createEmailTask", "ops\x00-lead", "'ops\\x00-lead' is not a valid name"),
    (NARROW, "createEmailTask", "ops-lead\ue000", "'ops-lead\\ue000' is not a valid name"),
    (OPEN, "createEmailTask", "\x00", "'\\x00' is not a valid name"),
])
def test_who_may_decide(policy: ApprovalPolicy, tool: str, reviewer: str,
                        expected: str | None) -> None:
    got = approval_refusal(policy, tool=tool, reviewer=reviewer, requester="alice")
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.startswith(expected)


@pytest.mark.parametrize(("reviewer", "requester", "before"), [
    ("\u0422\u041e\u041c", "tom", None), ("\u039a\u0391\u03a4\u0395", "kate", None),
    ("\u0412\u041e\u0412", "bob", None), ("AL\u0130CE", "alice", None),
    ("b\ud800ob", "alice", None),
    ("\u0430lice", "alice", "confusable with the requester"),
])
def test_the_lowercased_rule_is_kept_for_the_turns_that_decided_by_it(
        reviewer: str, requester: str, before: str | None) -> None:
    """What a turn begun before revision 4 replays (workflows/decisions.py):
    its rule let capital look-alikes and a lone surrogate decide; today's
    rule refuses them all."""
    got = approval_refusal(OPEN, tool="createEmailTask", reviewer=reviewer,
                           requester=requester, rule=NameRule.STANDARD)
    assert got is None if before is None else (got is not None and before in got)
    assert approval_refusal(OPEN, tool="createEmailTask", reviewer=reviewer,
                            requester=requester, rule=NameRule.CASE_BLIND) is not None


@pytest.mark.parametrize(("policy", "to", "problems", "notes"), [
    (OutboundPolicy(), "x@anywhere.test", 0, []),
    (OutboundPolicy(allowed_domains=["example.com"]), "ops@example.com", 0, []),
    (OutboundPolicy(allowed_domains=["example.com"]), "ops@EXAMPLE.com.", 0, []),
    (OutboundPolicy(allowed_domains=["example.com"]), "ops@sub.example.com", 1, []),
    (OutboundPolicy(allowed_domains=["example.com"]), "ops@example.com.evil.test", 1, []),
    (OutboundPolicy(allowed_domains=["example.com"], allow_external=True), "a@b.org", 0,
     ["external recipient: to at b.org"]),
])
def test_where_mail_may_go(policy: OutboundPolicy, to: str, problems: int,
                           notes: list[str]) -> None:
    found, said = outbound_findings(policy, {"to": to})
    assert len(found) == problems and said == notes


@pytest.mark.parametrize("separator", ["\r", "\n", "\u0085", "\u2028", "\u2029"])
def test_line_separators_are_refused_in_a_subject(separator: str) -> None:
    raw = json.dumps({"to": "ops@example.com", "subject": f"hi{separator}Bcc: x@evil.test",
                      "body": "b"})
    assert separator in json.loads(raw)["subject"]
    with pytest.raises(ToolArgumentError, match="single line"):
        createEmailTask.parse_arguments(raw)


@pytest.mark.parametrize("to", [
    "victim%attacker.test@example.com",  # %-relaying: would go to attacker.test
    "victim!attacker.test@example.com",  # bang path
    "@attacker.test:victim@example.com",  # source route
    "@a.test,@b.test:victim@example.com",
    '"victim@attacker.test"@example.com',  # a quoted local part holding an @
    "ops@example.com, cfo@attacker.test",  # two addresses in one field
    "Ops <ops@example.com>",  # a display name hides what is checked
    "ops@ex\u0430mple.com",  # a homograph domain (Cyrillic а)
])
def test_tricks_with_the_address_syntax_are_refused(to: str) -> None:
    found, _ = outbound_findings(OutboundPolicy(allowed_domains=["example.com"]), {"to": to})
    assert len(found) == 1 and found[0].startswith("to: "), found
    with pytest.raises(ToolArgumentError):
        createEmailTask.parse_arguments(json.dumps({"to": to, "subject": "s", "body": "b"}))


def test_plain_addresses_still_pass() -> None:
    policy = OutboundPolicy(allowed_domains=["example.com"])
    for to in ["ops@example.com", "first.last+tag@example.com", "o_p-s@EXAMPLE.com."]:
        assert outbound_findings(policy, {"to": to}) == ([], [])
