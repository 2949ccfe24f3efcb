"""`python -m bench.flow_provenance [--results N ...] [--repeat R]`: what
deriving a call's provenance costs (turnstile.engine.provenance, run in the
`review_call` activity for every call of a tool with sensitive arguments;
docs/information-flow.md, "Cost").

A conversation of the user's message and N tool results of ~2,000
characters (words, an address, an id and an amount each); one call with
three sensitive arguments: an address found in result 17, an IBAN found
nowhere, a sentence citing result 17's id. Prints, per N, the characters
read and the median milliseconds of R derivations, and the rule derived."""

from __future__ import annotations

import argparse
import random
import statistics
import time

from turnstile.engine.flow import FlowRule
from turnstile.engine.provenance import LabelledSource, derive

WORDS = "the rent invoice meeting please send report account customer order refund".split()
RULES: dict[str, FlowRule] = {"to": "review", "iban": "refuse", "body": "allow"}
ARGUMENTS = {"to": "user17@corp.example", "iban": "GB33BUKB20201555555555",
             "body": "Hi, see ID-000017 and the report."}


def result_text(rng: random.Random, i: int) -> str:
    return (" ".join(rng.choice(WORDS) for _ in range(300))
            + f" contact user{i}@corp.example ref ID-{i:06d} amount {i * 7},00")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=int, nargs="+", default=[40, 400])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(1)
    for n in args.results:
        sources = [LabelledSource(kind="user", trusted=True, text="pay the rent to my landlord")]
        sources += [LabelledSource(kind="tool", trusted=False, text=result_text(rng, i),
                                   tool_name="read", tool_call_id=f"c{i}") for i in range(n)]
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            verdict = derive(RULES, ARGUMENTS, sources)
            times.append(time.perf_counter() - started)
        chars = sum(len(s.text) for s in sources)
        print(f"{n} tool results ({chars} characters): median "
              f"{statistics.median(times) * 1000:.1f} ms of {args.repeat}; rule {verdict.rule} "
              f"(untrusted: {', '.join(verdict.untrusted) or 'none'})")


if __name__ == "__main__":
    main()
