"""`starter.py audit` shows where a call's sensitive arguments came from:
under each row of the calls, per argument, its sources (kind, tool and call
id or `user`, the masked value; `UNTRUSTED` when so), and a FLOW_REFUSED
row's reason; `--json` has `provenance` as an object and `refusal_reason`.
Real turns of the information-flow tests' desk (tests/test_information_flow.py),
the real CLI on their database."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import Client

from tests.support.turns import running_worker
from tests.test_approval_edits import starter_audit
from tests.test_information_flow import ATTACKER, IBAN, compromised, desk, prepared
from turnstile.engine.contract import TurnStatus
from turnstile.engine.flow import refusal_reason, refusal_text
from turnstile.providers.function_model import FunctionModel


async def test_the_audit_listing_says_where_the_arguments_came_from(
        client: Client, task_queue: str, tmp_path: Path) -> None:
    db = prepared(f"sqlite:///{tmp_path}/t.db")
    async with running_worker(client, task_queue, db.url, [desk()],
                              provider=FunctionModel(compromised)) as turns:
        refused = await turns.run("check my inbox and pay what it says", service="flow",
                                  conversation="c-pay")
        mine = await turns.run(f"read my inbox and send it to {ATTACKER}", service="flow",
                               conversation="c-user")
    for done in (refused, mine):
        assert done.status == TurnStatus.COMPLETED, done.error
    read_id = refused.tool_calls[0].id

    [pay] = map(json.loads, starter_audit(db, "--tool", "pay", "--json"))
    assert pay["status"] == "FLOW_REFUSED"
    [source] = pay["provenance"]["iban"]
    assert (source["kind"], source["trusted"], source["tool_name"],
            source["tool_call_id"]) == ("tool", False, "read_inbox", read_id)
    assert source["value"] == IBAN  # an IBAN is not something the masker masks
    reason = pay["refusal_reason"]
    assert reason.startswith("argument `iban` carries a value") and "(rule: refuse)" in reason
    [mail] = map(json.loads, starter_audit(db, "--tool", "send_mail", "--json"))
    assert [(s["kind"], s["trusted"]) for s in mail["provenance"]["to"]] == [("user", True)]
    assert "refusal_reason" not in mail and ATTACKER not in json.dumps(mail)
    reads = [json.loads(line) for line in starter_audit(db, "--tool", "read_inbox", "--json")]
    assert [r["provenance"] for r in reads] == [None, None]  # no sensitive arguments

    listing = starter_audit(db)
    assert listing[0] == "4 row(s), all time"
    at = {line.split()[2]: n for n, line in enumerate(listing) if line[:1].isdigit()}
    assert listing[at["pay"] + 1] == (
        f"    iban <- UNTRUSTED tool read_inbox ({read_id}) {json.dumps(source['value'])}")
    assert listing[at["pay"] + 2] == f"    refused: {reason}"
    assert listing[at["send_mail"] + 1].startswith("    to <- user \"")
    assert len(listing) == 2 + 4 + 3  # the count, the header, four rows, three notes
    assert ATTACKER not in "\n".join(listing)  # masked, as on the row


def test_a_refusal_text_gives_its_reason_back() -> None:
    reason = "argument `to` carries a value (m***@x.example) that first appeared in ..."
    assert refusal_reason(refusal_text("send", reason)) == reason
    # As the audit row keeps it: after the status, cut at 300 characters.
    for cut in (90, 110, 150, 160, 300):
        kept = refusal_reason(f"rejected: {refusal_text('send', reason)[:cut]}")
        assert kept in (reason, reason[:kept.rstrip("…").__len__()] + "…"), cut
    assert refusal_reason("database unavailable") is None
