"""`python -m bench.masking_properties [--examples N] [--turns M] [--databases ...]`:
the masking properties of tests/test_masking_property.py and
tests/test_masking_turn_property.py, run longer.

1. The pure properties on turnstile.engine.masking (no server), N examples
   each, drawn at random (not the derandomized CI examples): no generated
   address or phone number survives masking in text, keys, values, integers
   and JSON in strings; masking twice changes nothing; ids, timestamps,
   counts, UUIDs and amounts stay as written.
2. The real-turn property (dev server, worker, fake model server, every
   sink searched), M turns on each database, through pytest
   (MASKING_TURN_EXAMPLES=M).

Prints, per property: examples run, failures found (with the falsifying
example), seconds. Exit 1 if any property failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from tests.test_masking_property import PROPERTIES

ROOT = Path(__file__).resolve().parents[1]


def run_pure(name: str, examples: int) -> tuple[int, int, float]:
    """(examples run, failures found, seconds) of one pure property."""
    check, strategies = PROPERTIES[name]
    ran = [0]

    def counted(**kw: object) -> None:
        ran[0] += 1
        check(**kw)

    test = settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])(given(**strategies)(counted))
    start = time.perf_counter()
    failures = 0
    try:
        test()
    except Exception:  # noqa: BLE001 - the property failed: report it, run the others
        failures = 1
        traceback.print_exc(limit=1)
    return ran[0], failures, time.perf_counter() - start


def run_turns(turns: int, database: str) -> tuple[int, int, float]:
    """(turns run, failures found, seconds) of the real-turn property on one database."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging",
         "-n", "0", "tests/test_masking_turn_property.py", "-k", database],
        cwd=ROOT, env={**os.environ, "MASKING_TURN_EXAMPLES": str(turns)},
        capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n")
        return turns, 1, seconds
    return turns, 0, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=5000, help="per pure property")
    parser.add_argument("--turns", type=int, default=40, help="real turns per database")
    parser.add_argument("--databases", nargs="*", default=["sqlite", "postgresql"])
    args = parser.parse_args(argv)
    rows: list[tuple[str, int, int, float]] = []
    for name in PROPERTIES:
        rows.append((name, *run_pure(name, args.examples)))
        print(f"{rows[-1][0]:<45} {rows[-1][1]:>6} examples {rows[-1][2]} failures "
              f"{rows[-1][3]:8.1f} s", flush=True)
    for database in args.databases:
        if args.turns:
            rows.append((f"real turns, every sink ({database})",
                         *run_turns(args.turns, database)))
            print(f"{rows[-1][0]:<45} {rows[-1][1]:>6} turns    {rows[-1][2]} failures "
                  f"{rows[-1][3]:8.1f} s", flush=True)
    failed = sum(r[2] for r in rows)
    print(f"\n{'property':<45} {'examples':>8} {'failures':>8} {'seconds':>8} {'ms/example':>10}")
    for name, ran, failures, seconds in rows:
        print(f"{name:<45} {ran:>8} {failures:>8} {seconds:>8.1f} "
              f"{1000 * seconds / max(ran, 1):>10.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
