"""The default build id changes whenever the workflow code does, and only then
(turnstile.runtime.workflow_code): a change of any workflow module, or of the
engine code the workflow imports, changes it; a change of an activity, a
store, the runtime, the package's public API or the docs does not. The same
files give the same id from another directory (another clone, a wheel
installed in site-packages) and with CRLF line endings."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from turnstile.engine.versions import TURN_REVISION, TURN_VERSION
from turnstile.runtime.versioning import default_build_id, package_version
from turnstile.runtime.workflow_code import (
    DIGEST_CHARS,
    WORKFLOW_ROOTS,
    digest,
    workflow_digest,
    workflow_sources,
)
from turnstile.workflows import AgentTurn

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("turnstile",)  # all the code; the top-level workflows/, activities/ are entry points


def copy_tree(dest: Path) -> Path:
    """The packages' sources, as a clone or an installed wheel holds them."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(ROOT / "docs", dest / "docs")
    return dest


def digest_of(tree: Path) -> str:
    workflow_sources.cache_clear()
    return workflow_digest((str(tree),))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("pristine"))


@pytest.fixture(scope="module")
def pristine_digest(pristine: Path) -> str:
    return digest_of(pristine)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return copy_tree(tmp_path / "site-packages")


def test_the_default_build_id_names_version_turn_and_workflow_code() -> None:
    build = default_build_id()
    assert build == f"{package_version()}-turn{TURN_VERSION}.{TURN_REVISION}-{workflow_digest()}"
    assert len(workflow_digest()) == DIGEST_CHARS and int(workflow_digest(), 16) >= 0
    assert default_build_id() == build  # computed once, the same every time


def test_the_workflow_code_is_the_workflow_package_and_the_engine_it_imports() -> None:
    found = set(workflow_sources())
    assert AgentTurn.__module__ in found
    assert AgentTurn.__module__.split(".")[0] in {r.split(".")[0] for r in WORKFLOW_ROOTS}
    every_workflow_file = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(
        ".__init__") for p in (ROOT / "turnstile" / "workflows").rglob("*.py")}
    assert every_workflow_file <= found
    # The engine modules the workflow reads, followed import by import
    # (engine.memory_window is imported only by other engine modules).
    assert {"turnstile.engine.versions", "turnstile.engine.contract", "turnstile.engine",
            "turnstile.engine.memory_window"} <= found
    # Nothing the workflow does not import: activities, stores, runtime, the
    # public API's __init__ (it re-exports the runtime).
    assert not {m for m in found if m.startswith(("turnstile.activities", "turnstile.stores",
                                                  "turnstile.runtime", "turnstile.sales"))}
    assert "turnstile" not in found


def test_another_directory_gives_the_same_digest(pristine_digest: str) -> None:
    """Another clone, or the files of an installed wheel in site-packages: the
    same files, the same id (contents and module names, never paths)."""
    assert pristine_digest == workflow_digest()


def test_crlf_line_endings_give_the_same_digest(tree: Path, pristine_digest: str) -> None:
    for path in (tree / "turnstile" / "workflows").rglob("*.py"):
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    assert digest_of(tree) == pristine_digest


def _workflow_modules() -> list[str]:
    return sorted(workflow_sources())


@pytest.mark.parametrize("module", _workflow_modules())
def test_a_change_of_any_workflow_module_changes_the_build_id(
        module: str, pristine: Path, pristine_digest: str, tmp_path: Path) -> None:
    # Only the changed module is copied apart: the others are linked to the
    # pristine tree (a full copy per module would take longer than the check).
    changed = tmp_path / "tree"
    for package in ("turnstile",):
        shutil.copytree(pristine / package, changed / package, copy_function=_link,
                        ignore=shutil.ignore_patterns("__pycache__"))
    path = changed.joinpath(*module.split("."))
    target = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    text = target.read_text()
    target.unlink()  # the link, not the pristine file
    target.write_text(text + "\n# a comment is a change of the file\n")
    assert digest_of(changed) != pristine_digest, module


def _link(src: str, dst: str) -> None:
    Path(dst).symlink_to(src)


@pytest.mark.parametrize("elsewhere", [
    "turnstile/activities/model.py",    # an activity
    "turnstile/stores/ledger.py",       # a store
    "turnstile/runtime/versioning.py",  # the runtime
    "turnstile/__init__.py",            # the public API
    "turnstile/sales/sales_tools.py",   # the reference app's tools
    "docs/design.md",                   # the docs
])
def test_a_change_elsewhere_keeps_the_build_id(elsewhere: str, tree: Path,
                                               pristine_digest: str) -> None:
    target = tree / elsewhere
    assert target.exists(), elsewhere
    target.write_text(target.read_text() + "\n# changed\n")
    assert digest_of(tree) == pristine_digest


def test_a_new_engine_import_joins_the_workflow_code(tree: Path, pristine: Path) -> None:
    """A workflow module that starts importing another module brings it in:
    the set is found by following imports, not listed by hand."""
    before = set(workflow_sources((str(pristine),)))
    assert "turnstile.stores.tables" not in before
    target = tree / "turnstile" / "workflows" / "saga.py"
    target.write_text(target.read_text() + "\nfrom turnstile.stores import tables  # noqa\n")
    workflow_sources.cache_clear()
    assert "turnstile.stores.tables" in workflow_sources((str(tree),))


def test_the_digest_is_over_names_and_contents() -> None:
    assert digest({"a": b"x", "b": b"y"}) == digest({"b": b"y", "a": b"x"})
    assert digest({"a": b"xy"}) != digest({"a": b"x", "b": b"y"})
    assert digest({"a": b"x"}) != digest({"b": b"x"})
