"""The public face: `turnstile.__all__` is what authors and clients import,
the reference app's service and the examples use nothing else, and an app
that cannot be loaded is one line and exit 2."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import turnstile
from turnstile.runtime.apps import AppLoadError, load_apps
from turnstile.runtime.config import Settings

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = {"turnstile", "turnstile.testing"}
# The contract's minimum (docs/contract.md, "v0.4 names").
REQUIRED = {"tool", "ToolContext", "ToolResult", "Service", "LoopPolicy", "BreakerPolicy",
            "OutboundPolicy", "MemoryWindow", "RetrySpec", "App", "TurnstileClient",
            "TurnInput", "TurnResult", "ToolExecutionError", "ToolArgumentError",
            "ToolInterrupted", "TurnstileError", "ModelSettings"}
# The reference app's modules a service author writes (its service, tools,
# app, approvers, documents). Its other modules are the project's own
# operator parts and reach into the stores on purpose: the truth check
# (check.py), the outbox and sender, the PostgreSQL roles (access.py), the
# bulk seed loader, the effects report, and the offline demo planner's
# script (planner.py: the demo planner's own format; new apps use a
# FunctionModel).
SALES_AUTHOR_MODULES = ["service", "sales_tools", "app", "approvers", "documents"]


def _turnstile_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "turnstile" or m.startswith("turnstile.")}


def test_every_exported_name_resolves_and_the_minimum_is_there() -> None:
    assert REQUIRED <= set(turnstile.__all__)
    for name in turnstile.__all__:
        assert getattr(turnstile, name) is not None, name
    with pytest.raises(AttributeError):
        _ = turnstile.NoSuchThing  # type: ignore[attr-defined]


def test_importing_the_package_alone_imports_no_layer() -> None:
    # Workflow code imports turnstile.engine through this package.
    out = subprocess.run(
        [sys.executable, "-c", "import sys, turnstile; "
         "print(sorted(m for m in sys.modules if m.startswith('turnstile')))"],
        capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "['turnstile']"


def test_the_package_ships_its_type_information() -> None:
    assert (ROOT / "turnstile" / "py.typed").exists()
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setup["package-data"]["turnstile"]
    # Every package under turnstile/ (the test kit among them), nothing else.
    assert setup["packages"]["find"]["include"] == ["turnstile", "turnstile.*"]


@pytest.mark.parametrize("path", [
    *sorted((ROOT / "examples").rglob("*.py")),
    *[ROOT / "turnstile" / "sales" / f"{m}.py" for m in SALES_AUTHOR_MODULES],
], ids=lambda p: str(p.relative_to(ROOT)))
def test_apps_import_only_the_public_api(path: Path) -> None:
    private = _turnstile_imports(path) - PUBLIC
    if path.parts[-3:-1] == ("turnstile", "sales"):
        private = {m for m in private if not m.startswith("turnstile.sales")}
    assert private == set()


def test_the_examples_import_turnstile_at_all() -> None:
    # Guard against a walker that finds nothing and so passes vacuously.
    assert _turnstile_imports(ROOT / "examples" / "support_desk" / "tools.py") == {"turnstile"}


def test_turnstile_apps_names_what_is_served() -> None:
    assert [a.name for a in load_apps(Settings.from_env({}))] == ["sales"]
    chosen = load_apps(Settings.from_env({"TURNSTILE_APPS": "examples.support_desk:app"}))
    assert [a.name for a in chosen] == ["support-desk"]
    # a function returning an App works too
    both = load_apps(Settings.from_env({
        "TURNSTILE_APPS": "examples.support_desk:build_app, turnstile.sales.app:build_sales_app"}))
    assert [a.name for a in both] == ["support-desk", "sales"]


@pytest.mark.parametrize(("spec", "says"), [
    ("no_such_pkg.apps:app", "ModuleNotFoundError"),
    ("examples.support_desk:nothing_here", "has no attribute 'nothing_here'"),
    ("examples.support_desk", "is not module:attribute"),
    ("examples.support_desk.tables:TABLES", "not an App"),
])
def test_an_app_that_cannot_be_loaded_says_why(spec: str, says: str) -> None:
    with pytest.raises(AppLoadError) as err:
        load_apps(Settings.from_env({"TURNSTILE_APPS": spec}))
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("variable", "program"), [
    ("TURNSTILE_APPS", ["worker.py"]), ("TURNSTILE_PLUGINS", ["worker.py"]),
    ("TURNSTILE_APPS", ["starter.py", "up"]), ("TURNSTILE_APPS", ["-m", "turnstile.db",
                                                                   "upgrade"]),
    ("TURNSTILE_APPS", ["-m", "turnstile", "worker"]),
    ("TURNSTILE_APPS", ["-m", "turnstile", "up"]),
])
def test_the_programs_exit_2_with_one_line(tmp_path: Path, variable: str,
                                           program: list[str]) -> None:
    env = {**os.environ, variable: "my_team.agent:build", "TURNSTILE_DATA_DIR": str(tmp_path),
           "DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}",
           # nothing to reach: the failure must come before any connection
           "TEMPORAL_ADDRESS": "127.0.0.1:9"}
    done = subprocess.run([sys.executable, *program], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert variable in lines[0] and "'my_team.agent'" in lines[0] \
        and "ModuleNotFoundError" in lines[0]
