"""RELEASES.md is the record of the releases: one row per release (version,
full commit hash, date), each commit in main's history (so every full clone
has it, tags or not), each version with its CHANGELOG section; and the upgrade
tests' previous release is the newest row whose version is not the package's."""

from __future__ import annotations

import re
from datetime import date

import pytest

from tests.support.releases import (
    RELEASES,
    ROOT,
    git,
    in_history,
    previous_release,
    releases,
)

TABLE = """
| version | commit | date |
|---|---|---|
| 0.2.0 | 0a34d3d53164cbeb7c461b24ff8a4329725c2854 | 2026-12-02 |
| 0.3.0 | 9dd608fdc17d1e2693e77acb99b2db35d5e82c30 | 2026-12-04 |
"""
CUT = TABLE + f"| 0.4.0 | {'a' * 40} | 2026-12-06 |\n"


def test_every_row_is_version_full_commit_and_date() -> None:
    text = RELEASES.read_text()
    rows = [line for line in text.splitlines()
            if line.startswith("|") and not line.startswith(("| version", "|---"))]
    found = releases()
    assert len(rows) == len(found) >= 2, "a table row RELEASES.md's format does not read"
    assert len({r.version for r in found}) == len(found)
    for release in found:
        date.fromisoformat(release.date)
    assert "0.3.0" in {r.version for r in found}
    assert {r.version: r.commit for r in found}["0.3.0"].startswith("9dd608f")


def test_every_release_commit_is_in_this_history_and_dated_no_later_than_its_row() -> None:
    head = git("rev-parse", "HEAD").stdout.decode().strip()
    for release in releases():
        assert in_history(release.commit), release
        assert git("merge-base", "--is-ancestor", release.commit, head).returncode == 0, release
        made = git("show", "-s", "--format=%cs", release.commit).stdout.decode().strip()
        assert made <= release.date, (release, made)


def test_every_release_has_its_changelog_section() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    sections = set(re.findall(r"^## (\d+\.\d+\.\d+)\b", changelog, re.M))
    assert {r.version for r in releases()} <= sections


@pytest.mark.parametrize(("version", "table", "previous"), [
    ("0.3.0", TABLE, "0.2.0"),       # the package says a row's version: the row before it
    ("0.4.0", TABLE, "0.3.0"),       # the release being cut, before its row is written
    ("0.4.0", CUT, "0.3.0"),         # ... and after
    ("0.5.0.dev0", CUT, "0.4.0"),    # main after the cut
])
def test_the_previous_release_is_the_newest_row_of_another_version(
        version: str, table: str, previous: str) -> None:
    assert previous_release(version, table).version == previous


def test_rows_in_any_order_are_read_by_version() -> None:
    shuffled = "\n".join(reversed(CUT.strip().splitlines()[2:]))
    assert [r.version for r in releases(shuffled)] == ["0.2.0", "0.3.0", "0.4.0"]
    assert previous_release("0.5.0.dev0", shuffled).version == "0.4.0"
