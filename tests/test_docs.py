"""The docs explain the repository and only it: every link points at a file
that exists (and, for code, at a name defined there), nothing points outside
the repository, and the contract names every status, error type and activity
the code has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from turnstile.engine import activity_io as io, errors
from turnstile.engine.contract import AuditStatus, CallStatus, TurnStatus

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_DIRS = {".venv", ".git", ".data", "__pycache__", ".mypy_cache", ".ruff_cache",
             "turnstile.egg-info", "histories"}
LINK = re.compile(r"\[([^\]]+)\]\(([^)#\s]+)(#[^)]*)?\)")


def repo_files() -> list[Path]:
    return [p for p in ROOT.rglob("*")
            if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts)
            and p.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ""}]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_resolve_to_files_and_names(doc: Path) -> None:
    text = doc.read_text()
    links = LINK.findall(text)
    for label, target, _anchor in links:
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (doc.parent / target).resolve()
        assert path.exists(), f"{doc.name}: [{label}]({target}) points at nothing"
        assert path.is_relative_to(ROOT), f"{doc.name}: {target} is outside the repository"
        if path.suffix != ".py":
            continue
        source = path.read_text()
        for name in re.findall(r"`([^`]+)`", label):
            if "/" in name or name.endswith(".py"):
                continue  # the label is the path itself
            last = name.split(".")[-1].strip("()")
            if last == path.stem or last in path.parts:
                continue  # the label names the module (or its package)
            assert re.search(rf"^\s*(async def|def|class) {re.escape(last)}\b|^{re.escape(last)} =",
                             source, re.M), f"{doc.name}: {name} is not defined in {target}"


def test_pipeline_links_every_step_to_code() -> None:
    text = (ROOT / "docs" / "pipeline.md").read_text()
    code = text[text.index("## Where the code is"):]
    rows = [r for r in code.splitlines() if re.match(r"\| \d+ \|", r)]
    assert [int(r.split("|")[1]) for r in rows] == list(range(1, 18))
    for row in rows:
        workflow_cell = row.split("|")[3]
        assert LINK.search(workflow_cell), row


def test_nothing_points_outside_the_repository() -> None:
    outside = re.compile(r"shared/|temporal-notes|design\.md §|legacy_histories|"
                         r"test_pipeline_replay|patch marker `")
    offenders = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in repo_files()
                 if p.name != "test_docs.py"
                 for m in [outside.search(p.read_text(errors="replace"))] if m]
    assert offenders == []


def test_contract_names_every_status_error_and_activity() -> None:
    contract = (ROOT / "docs" / "contract.md").read_text()
    for enum in (TurnStatus, CallStatus, AuditStatus):
        for member in enum:
            assert f"`{member.value}`" in contract, f"{enum.__name__}.{member.name}"
    # Errors a turn can end with; these never reach `error.type` (raised at
    # registration, base classes, retried until they turn into a timeout, or
    # reported as a compensation failure).
    internal = {"TurnstileError", "DuplicateToolError", "BreakerTripped", "ModelUnavailable",
                "ConversationBusy", "NoCompensation", "NotInWorkflow"}
    for cls in vars(errors).values():
        if isinstance(cls, type) and issubclass(cls, errors.TurnstileError):
            if cls.error_type not in internal and cls is not errors.TurnCancelled:
                assert cls.error_type in contract, cls.error_type
    for name, value in vars(io).items():
        if name.isupper() and isinstance(value, str) and value.startswith("turnstile."):
            assert f"`{value}`" in contract, value
