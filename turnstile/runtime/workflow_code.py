"""Which code replays a turn, and its digest: the part of the default build id
(turnstile.runtime.versioning) that changes whenever the workflow code does.

The workflow code is the package of the workflow definitions
(`WORKFLOW_ROOTS`: every module under it) and every project module those
import, followed import by import: the engine modules the workflow reads
(turnstile.engine), whatever they import in turn. It is found by reading the
modules' `import` statements (`ast`), not by importing them, so the same
files give the same set on any machine, in a checkout or from an installed
wheel (the files in site-packages). A package's `__init__` counts only when a
module imports the package itself (`from turnstile.engine import activity_io`
reads turnstile/engine/__init__.py; `import turnstile.engine.x` alone does not
pull in turnstile/__init__.py and the public API it re-exports).

The digest is SHA-256 over each module's dotted name and its source with line
endings normalised to LF, in name order: file contents, never paths, times or
bytecode. A change of an activity-only module, a store, the runtime or the docs
leaves it alone; a change of any workflow module or of the engine code they
import changes it (tests/test_build_id.py).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from collections.abc import Sequence
from functools import cache, lru_cache
from importlib.machinery import PathFinder
from pathlib import Path

# The packages that hold the workflow definitions (AgentTurn's module is
# under one of them: tests/test_build_id.py checks it).
WORKFLOW_ROOTS: tuple[str, ...] = ("turnstile.workflows",)
# The project's top-level packages: imports of anything else (the standard
# library, temporalio, pydantic) are not followed.
PROJECT_PACKAGES: frozenset[str] = frozenset({"turnstile"})
DIGEST_CHARS = 10


class WorkflowCodeNotFound(RuntimeError):
    """A workflow module's source cannot be read (a sourceless install)."""


# Where to look for the packages: None = sys.path, as the worker imports them.
Search = Sequence[str] | None


def _top_location(top: str, search: Search) -> list[Path]:
    """Where a top-level package's files are, without importing it."""
    spec = (importlib.util.find_spec(top) if search is None
            else PathFinder.find_spec(top, list(search)))
    if spec is None or not spec.submodule_search_locations:
        raise WorkflowCodeNotFound(f"package {top!r} is not installed")
    return [Path(p) for p in spec.submodule_search_locations]


def source_file(module: str, search: Search = None) -> Path | None:
    """The .py file of a project module (a package: its __init__.py); None
    if there is no such module (a name imported from a module, not a module)."""
    top, *rest = module.split(".")
    for base in _top_location(top, search):
        stem = base.joinpath(*rest)
        for candidate in (stem / "__init__.py", stem.with_suffix(".py")):
            if candidate.is_file():
                return candidate
    return None


def _package_modules(root: str, search: Search) -> list[str]:
    """Every module under a package (its files, in name order)."""
    found = []
    for base in _top_location(root.split(".")[0], search):
        here = base.joinpath(*root.split(".")[1:])
        for path in sorted(here.rglob("*.py")):
            parts = list(path.relative_to(here).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append(".".join([root, *parts]))
    return found


@lru_cache(maxsize=1024)
def _imported(module: str, is_package: bool, source: bytes) -> frozenset[str]:
    """The project modules a module's source imports (at any depth of its code).
    Kept per source: a file read again unchanged is not parsed again."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename=module)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return frozenset(n for n in names if n.split(".")[0] in PROJECT_PACKAGES)


@cache
def workflow_sources(search: tuple[str, ...] | None = None) -> dict[str, bytes]:
    """The workflow code: module name -> its source (LF line endings).
    `search`: directories to find the packages in (None: sys.path)."""
    pending = [m for root in WORKFLOW_ROOTS for m in _package_modules(root, search)]
    if not pending:
        raise WorkflowCodeNotFound(f"no workflow modules under {WORKFLOW_ROOTS}")
    sources: dict[str, bytes] = {}
    while pending:
        module = pending.pop()
        if module in sources:
            continue
        path = source_file(module, search)
        if path is None:
            continue  # `from package import name` where name is not a module
        raw = path.read_bytes().replace(b"\r\n", b"\n")
        sources[module] = raw
        pending.extend(_imported(module, path.name == "__init__.py", raw) - sources.keys())
    return sources


def digest(sources: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for module in sorted(sources):
        body = sources[module]
        h.update(f"{module}\n{len(body)}\n".encode())
        h.update(body)
    return h.hexdigest()


@cache
def workflow_digest(search: tuple[str, ...] | None = None) -> str:
    """The first `DIGEST_CHARS` hex digits of the workflow code's digest."""
    return digest(workflow_sources(search))[:DIGEST_CHARS]
