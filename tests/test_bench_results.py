"""bench/README.md's current figures are the table bench/results_table.py
renders from bench/results/*.json: no figure in it is typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

from bench import results_table

RESULTS = Path(results_table.__file__).resolve().parent / "results"


def test_the_readme_table_is_rendered_from_the_results_files() -> None:
    readme = results_table.README.read_text()
    assert results_table.replaced(readme, results_table.render()) == readme
    assert results_table.main(["--check"]) == 0


def test_every_results_file_names_its_run_and_each_figure_shows(tmp_path: Path) -> None:
    files = sorted(RESULTS.glob("*.json"))
    assert files
    for path in files:
        run = json.loads(path.read_text())
        assert {"bench", "command", "measured", "machine", "figures"} <= set(run), path.name
        assert run["command"].startswith(".venv/bin/python -m " + run["bench"]), path.name
    # A new run's file changes the table: the README would then be stale.
    (tmp_path / "x.json").write_text(json.dumps({
        "bench": "bench.x", "command": ".venv/bin/python -m bench.x", "measured": "today",
        "machine": "m", "figures": [{"name": "speed", "value": 1234, "unit": "ms"}]}))
    table = results_table.render(tmp_path)
    assert "| `bench.x` | speed | 1,234 ms | — | today | — |" in table
    stale = results_table.replaced(results_table.README.read_text(), table)
    assert stale != results_table.README.read_text()
