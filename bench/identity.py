"""The identity rule over all of Unicode's confusables.txt, longer than CI
runs it (tests/test_identity_confusables.py), with its figures
(docs/identity.md):

    .venv/bin/python -m bench.identity                  # SQLite
    .venv/bin/python -m bench.identity postgresql://postgres@127.0.0.1:5432/test

- every (attacker, requester) pair of every entry against `same_person` and
  `approval_refusal` (self-approval), with the time per pair;
- the budget's query (`usage.person_of`) for every entry, one pair each,
  against a database holding every attacker's row (CI: the look-alikes of
  letters and digits, and a sample on PostgreSQL);
- the false merges: pairs of names of one and two characters from `a-z0-9`
  that this rule and the lower-cased rule before it make one person.

The database given is used as a scratch: its `model_usage` rows are deleted.
"""

from __future__ import annotations

import itertools
import string
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from tests.support.databases import migrate
from tests.test_identity_confusables import PAIRS, one_per_entry
from turnstile.engine import identity, identity_lowercased
from turnstile.engine.approvals import ApprovalPolicy, approval_refusal
from turnstile.stores import usage
from turnstile.stores.db import Database


def relation() -> None:
    started = time.perf_counter()
    apart = sum(not identity.same_person(a, r) for _, a, r in PAIRS)
    allowed = sum(approval_refusal(ApprovalPolicy(), tool="t", reviewer=a, requester=r) is None
                  for _, a, r in PAIRS)
    took = time.perf_counter() - started
    print(f"pairs: {len(PAIRS)} from {len({s for s, _, _ in PAIRS})} entries; apart: {apart}; "
          f"approved their requester's call: {allowed}; {took / len(PAIRS) * 1e6:.0f} µs a pair")


def budget(url: str) -> None:
    db = Database(url)
    migrate(db)
    pairs = one_per_entry()
    with db.connect() as conn:
        conn.execute("DELETE FROM model_usage")
        for n, attacker in enumerate(dict.fromkeys(a for _, a, _ in pairs)):
            usage.record(conn, usage.ModelCall(
                workflow_id=f"w{n}", run_id="r", call_seq=0, conversation_id="c",
                user_id=attacker, service="s", model="m", prompt_tokens=1,
                completion_tokens=0), recorded_at="2026-12-04T10:00:00.000+00:00")
    rows = {a: usage.usage_key(f"w{n}", "r", 0)
            for n, a in enumerate(dict.fromkeys(a for _, a, _ in pairs))}
    started = time.perf_counter()
    missed = 0
    with db.connect() as conn:
        for _, attacker, requester in pairs:
            found = conn.scalars(sa.select(usage.c.usage_key).where(usage.person_of(requester)),
                                 str)
            missed += rows[attacker] not in found
    took = time.perf_counter() - started
    print(f"budget ({db.dialect}): {len(pairs)} entries, {missed} look-alike(s) not counted; "
          f"{took / len(pairs) * 1e3:.2f} ms a query over {len(rows)} rows")


def false_merges() -> None:
    names = string.ascii_lowercase + string.digits
    for size in (1, 2):
        spelled = ["".join(p) for p in itertools.product(names, repeat=size)]
        now = before = 0
        for a, b in itertools.combinations(spelled, 2):
            now += identity.same_person(a, b)
            before += identity_lowercased.same_person(a, b)
        print(f"names of {size} from a-z0-9: {len(spelled)}; pairs one person: {now} "
              f"(lower-cased rule: {before})")


def main() -> None:
    relation()
    if len(sys.argv) > 1:
        budget(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            budget(f"sqlite:///{Path(tmp) / 'usage.db'}")
    false_merges()


if __name__ == "__main__":
    main()
