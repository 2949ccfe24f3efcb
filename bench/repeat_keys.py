"""`python -m bench.repeat_keys [--examples N]`: the repeat breaker's key
properties of tests/test_repeat_breaker_keys.py, run longer (CI runs 60 a
property), and what a key costs.

Prints, per property, the examples run and the seconds taken; then the
microseconds to validate a createEmailTask call and compute its comparison
key (turnstile.engine.equivalence), median of 2,000, beside validation alone:
the key is computed in activities that validate the call anyway. Exit 1 with
the falsifying example if a property fails."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings, strategies as st

from tests import test_repeat_breaker_keys as props
from turnstile.sales.sales_tools import createEmailTask


def longer(test: Any, examples: int, *strategies: st.SearchStrategy[Any]) -> Callable[[], None]:
    """The property's body, drawn `examples` times (random, not derandomized)."""
    inner = test.hypothesis.inner_test
    return settings(max_examples=examples, deadline=None, database=None)(
        given(*strategies)(inner))


def micros(fn: Callable[[], object], n: int = 2000) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=2000)
    n = parser.parse_args(argv).examples
    body = st.text(props.WORD_CHARS + " ", min_size=1, max_size=40).filter(str.strip)
    runs = {
        "rewordings have the key": longer(props.test_rewordings_of_a_call_have_its_key, n,
                                          st.data(), props.notify_calls()),
        "real differences change it": longer(props.test_real_differences_change_the_key, n,
                                             st.data(), props.notify_calls()),
        "createEmailTask by meaning": longer(props.test_createEmailTask_is_compared_by_meaning,
                                             n, st.data(), props.addresses, props.subjects,
                                             body),
    }
    for name, run in runs.items():
        start = time.perf_counter()
        run()
        print(f"{name:32s} {n:6d} examples  {time.perf_counter() - start:6.1f} s")
    raw = json.dumps({"to": "OPS@Example.com", "subject": "Follow up ", "body": "C0001"})
    parse = micros(lambda: createEmailTask.parse_arguments(raw))
    keyed = micros(lambda: createEmailTask.repeat_key(createEmailTask.parse_arguments(raw)))
    print(f"validate a createEmailTask call: {parse:.1f} us; validate and key it: {keyed:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
