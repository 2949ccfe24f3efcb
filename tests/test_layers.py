"""The package tree's five layers, checked by walking the imports.

app (turnstile.sales) -> activities (turnstile.activities) and the public
outbox (turnstile.outbox) -> runtime
(turnstile.runtime, turnstile.providers) -> stores (turnstile.stores) ->
engine (turnstile.engine): a module may import its own layer or a lower one,
never a higher one; turnstile.workflows imports only the engine; no module
imports one that (transitively) imports it back; the app is handed to the
runtime by the command line (turnstile.cli) and `python -m turnstile.db` only.
The repository's top-level workflows/, activities/, worker.py and starter.py
are entry points into the package that import nothing else.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYER = {"turnstile.engine": 0, "turnstile.stores": 1, "turnstile.runtime": 2,
         "turnstile.providers": 2, "turnstile.activities": 3, "turnstile.outbox": 3,
         "turnstile.sales": 4}
APP = "turnstile.sales"
# The programs that still name the reference app: starter.py's sales-only
# commands (check, --show-effects) and `turnstile.db query-window` (the sales
# table's row-level security). The worker imports no app: it loads those
# TURNSTILE_APPS names (turnstile.runtime.apps).
WIRING = {"turnstile.cli.starter", "turnstile.db"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


ENTRY_POINTS = ("workflows/__init__.py", "activities/__init__.py", "worker.py", "starter.py")


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "turnstile").rglob("*.py"):
        found[_module_name(path)] = path
    for script in ENTRY_POINTS:
        found[_module_name(ROOT / script)] = ROOT / script
    return found


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every project module `path` imports, at any depth of its code."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        out |= {n for n in names if n in known}
    return out


def _layer(module: str) -> int | None:
    for prefix, layer in LAYER.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


GRAPH = {m: _imports(p, set(_modules())) for m, p in _modules().items()}


def test_lower_layers_never_import_higher_ones() -> None:
    violations = []
    for module, imported in GRAPH.items():
        mine = _layer(module)
        for target in imported:
            theirs = _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                violations.append(f"{module} -> {target}")
    assert violations == []


def test_the_providers_never_import_the_runtime() -> None:
    """Same layer, one direction: the runtime builds providers from its
    settings; a provider takes what it needs (turnstile.providers.ProviderSettings)."""
    up = [f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("turnstile.providers")
          for t in ts if t.startswith("turnstile.runtime")]
    assert up == []


def test_workflows_import_only_the_engine() -> None:
    bad = [f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("turnstile.workflows")
           for t in ts if not (t.startswith("turnstile.engine")
                               or t.startswith("turnstile.workflows"))]
    assert bad == []


def test_no_import_cycles() -> None:
    # A package's __init__ re-exporting its own modules is not a cycle of ideas;
    # edges from a package to its own submodules are left out.
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in GRAPH.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert cycles == []


def test_only_the_programs_wire_the_app() -> None:
    """Nothing below the app finds it by importing it; worker.py, starter.py
    and the operator CLI hand it over (turnstile.runtime.apps.App)."""
    importers = {m for m, ts in GRAPH.items() if not (m == APP or m.startswith(APP + "."))
                 and any(t == APP or t.startswith(APP + ".") for t in ts)}
    assert importers == WIRING


def test_the_walker_sees_imports() -> None:
    # Guard against a walker that finds nothing and so passes vacuously.
    assert "turnstile.engine.messages" in GRAPH["turnstile.stores.memory"]
    assert "turnstile.activities.data_errors" in GRAPH["turnstile.temporal_plugin"]
    assert _layer("turnstile.sales.sales_tools") == 4
    assert _layer("turnstile.activities.tool_calls") == 3


def test_the_entry_points_only_enter_the_package() -> None:
    """worker.py, starter.py, workflows/ and activities/ are not installed
    (pyproject.toml): each only names the package module that holds its code."""
    for script in ENTRY_POINTS:
        name = _module_name(ROOT / script)
        assert GRAPH[name], name
        assert all(t.startswith("turnstile.") for t in GRAPH[name]), (name, GRAPH[name])
        assert not any(m.startswith(name + ".") for m in GRAPH), name


def test_the_runtime_reads_no_checkout_files() -> None:
    # The project is the directory a command runs in (here, the checkout the
    # tests run from), never the installed package's location: installed in
    # site-packages, turnstile/../.. is no project of anyone's.
    from turnstile.runtime.config import DATA_DIR, PROJECT_ROOT
    from turnstile.runtime.devstack import temporal_binary  # noqa: F401  (imports cleanly)

    assert PROJECT_ROOT == Path.cwd()
    assert "TURNSTILE_DATA_DIR" in os.environ or DATA_DIR == Path.cwd() / ".data"
