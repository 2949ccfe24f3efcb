"""The releases the repository records (RELEASES.md) and their code.

RELEASES.md names each release's commit; tags do not travel between clones,
commits of main's history do. The previous release is the newest row whose
version is not the package's own (after 0.4.0 is cut and main moves to
0.5.0.dev0, that is 0.4.0; while the package still says the version of a row,
the row before it). Its code is that commit's tree (`git archive`), run by the
tests as its own `worker.py` with this environment's libraries (the releases
share their dependencies), beside a minimal `dist-info` saying its version, so
that its default build id is the one its own install would have.
"""

from __future__ import annotations

import re
import subprocess
import tarfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

import pytest

from turnstile.runtime.versioning import package_version

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ROOT / "RELEASES.md"
# | version | full commit hash | date |
ROW = re.compile(r"^\|\s*(\d+\.\d+\.\d+\S*)\s*\|\s*([0-9a-f]{40})\s*\|"
                 r"\s*(\d{4}-\d{2}-\d{2})\s*\|\s*$")


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    date: str

    @property
    def key(self) -> tuple[int, ...]:
        return version_key(self.version)


def version_key(version: str) -> tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    assert match, version
    return tuple(int(p) for p in match.groups())


def releases(text: str | None = None) -> list[Release]:
    """Every row of RELEASES.md's table, oldest version first."""
    source = RELEASES.read_text() if text is None else text
    found = [Release(*m.groups()) for line in source.splitlines() if (m := ROW.match(line))]
    return sorted(found, key=lambda r: r.key)


def previous_release(version: str | None = None, text: str | None = None) -> Release:
    """The newest release whose version is not `version` (the package's)."""
    mine = package_version() if version is None else version
    older = [r for r in releases(text) if r.version != mine]
    if not older:
        raise AssertionError(f"RELEASES.md names no release other than {mine}")
    return older[-1]


def git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True)


def in_history(commit: str) -> bool:
    return git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def release_tree(release: Release, dest: Path) -> Path:
    """The release's files under `dest`, from its commit in this clone's history."""
    if not in_history(release.commit):
        pytest.fail(f"RELEASES.md names commit {release.commit} for {release.version}, which "
                    "this clone does not have (a shallow clone? `git fetch --unshallow`)")
    archive = git("archive", release.commit)
    assert archive.returncode == 0, archive.stderr.decode()
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    info = dest / f"turnstile-{release.version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: turnstile\nVersion: {release.version}\n")
    return dest


def supports_schema_window(tree: Path) -> bool:
    """Does the release run on a newer compatible schema (0.4.0 onward)? Its
    migrator logs the contract's line when it does."""
    schema = tree / "turnstile" / "stores" / "schema.py"
    window = tree / "turnstile" / "stores" / "schema_window.py"
    return any(p.exists() and "runs on a newer schema" in p.read_text()
               for p in (schema, window))


def supports_worker_versioning(tree: Path) -> bool:
    """Does the release run as a Worker Deployment Version (0.3.0 onward)?"""
    return (tree / "turnstile" / "runtime" / "versioning.py").exists()


VERSIONS = "turnstile/migrations/versions"


def _head(sources: list[str]) -> str:
    """The newest revision of a set of migration files' sources."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for text in sources:
        rev = re.search(r'^revision = ["\']([^"\']+)["\']', text, re.M)
        down = re.search(r'^down_revision = (None|["\'][^"\']+["\']|\([^)]*\))', text, re.M)
        if rev is not None and down is not None:
            revisions.add(rev.group(1))
            parents |= set(re.findall(r'["\']([^"\']+)["\']', down.group(1)))
    [head] = revisions - parents
    return head


def head_of(tree: Path) -> str:
    """The newest migration revision of a release's tree."""
    return _head([p.read_text() for p in (tree / VERSIONS).glob("*.py")])


def head_at(release: Release) -> str:
    """The newest migration revision of a release, read from its commit."""
    listing = git("ls-tree", "--name-only", f"{release.commit}:{VERSIONS}")
    assert listing.returncode == 0, listing.stderr.decode()
    names = [n for n in listing.stdout.decode().split() if n.endswith(".py")]
    return _head([git("show", f"{release.commit}:{VERSIONS}/{n}").stdout.decode()
                  for n in names])
