"""bench/README.md's table of current figures, rendered from bench/results/*.json.

    .venv/bin/python -m bench.results_table           # print the table
    .venv/bin/python -m bench.results_table --write   # put it into bench/README.md
    .venv/bin/python -m bench.results_table --check   # exit 1 if README.md's is not it

A results file is one benchmark's latest run: the command, when, at which
commit, on which machine, and its figures (name, value, unit, goal). A new
run replaces its file; what earlier runs said stays in the notebook,
bench/HISTORY.md. The table lives between the two markers below in README.md
and is never edited by hand."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"
BEGIN = "<!-- results table: rendered by `python -m bench.results_table --write` -->"
END = "<!-- end of results table -->"


def _value(figure: dict[str, Any]) -> str:
    value, unit = figure["value"], figure.get("unit", "")
    if unit == "x":
        return f"{value}×"
    return f"{value:,} {unit}".strip() if isinstance(value, int) else f"{value} {unit}".strip()


def render(results: Path = RESULTS) -> str:
    """The table, one row per figure, each benchmark's rows together."""
    rows = ["| benchmark | figure | value | goal | measured | commit |",
            "|---|---|---|---|---|---|"]
    for path in sorted(results.glob("*.json")):
        run = json.loads(path.read_text())
        for figure in run["figures"]:
            rows.append(
                f"| `{run['bench']}` | {figure['name']} | {_value(figure)} | "
                f"{figure.get('goal') or '—'} | {run['measured']} | {run.get('commit') or '—'} |")
    commands = [f"- `{run['bench']}`: `{run['command']}` ({run['machine']})"
                for run in (json.loads(p.read_text()) for p in sorted(results.glob("*.json")))]
    return "\n".join([*rows, "", "Commands and machines:", "", *commands])


def replaced(readme: str, table: str) -> str:
    """`readme` with the text between the markers replaced by `table`."""
    head, begin, rest = readme.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{README.name} lacks the results table's markers")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite bench/README.md's table")
    mode.add_argument("--check", action="store_true", help="exit 1 if README.md's is stale")
    args = parser.parse_args(argv)
    table = render()
    if not (args.write or args.check):
        sys.stdout.write(table + "\n")
        return 0
    current = README.read_text()
    wanted = replaced(current, table)
    if args.check:
        if wanted != current:
            sys.stderr.write("bench/README.md's table is not bench/results' "
                             "(python -m bench.results_table --write)\n")
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
