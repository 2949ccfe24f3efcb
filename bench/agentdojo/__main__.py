"""`python -m bench.agentdojo`: AgentDojo's suites through real turns; prints
per suite and model: utility, attacks reaching their effect (of the pairs
whose injection task has calls), text-only injections said (of the pairs
whose injection task only asks the model to say something: an output check,
not an effect), calls sent to review (and how many of them served the user
task), and the known checker artefacts.

    python -m bench.agentdojo [--suite S] [--model benign|compromised]
        [--reviewer none|perfect] [--kill-worker N] [--rules on|off] [--limit N]
        [--allow SUITE.TOOL[.ARG]] [--json PATH]

The benign oracle runs each user task once (no injection); the compromised
oracle runs every (user task, injection task) pair. `--kill-worker N`: the
worker runs as a child process and is SIGKILLed N times during the run (and
restarted); then `turnstile check` runs on the database. `--allow`: the
rules on, but some reviews taken away — what the calls they hold back would
do (bench/README.md: the benign reviews that remain, and the attacks they
stop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.agentdojo import app as apps, figures, oracles, rules as flow_rules, runner, suites
from bench.agentdojo.stack import ChildWorker, InProcess

log = logging.getLogger("bench.agentdojo")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.agentdojo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=suites.SUITES, action="append",
                   help="a suite (repeatable; default: all four)")
    p.add_argument("--model", choices=oracles.KINDS, action="append",
                   help="an oracle (repeatable; default: both)")
    p.add_argument("--reviewer", choices=runner.REVIEWERS, default="none")
    p.add_argument("--rules", choices=("on", "off"), default=None,
                   help="the information-flow rules of bench/agentdojo/rules.py (default: on "
                        "where this Turnstile has them)")
    p.add_argument("--allow", action="append", default=[], metavar="SUITE.TOOL[.ARG]",
                   help="rules on, but this argument (or the whole tool, its approval too) "
                        "allowed: what its reviews hold back (repeatable; not with "
                        "--kill-worker)")
    p.add_argument("--kill-worker", type=int, default=0, metavar="N",
                   help="SIGKILL the worker N times during the run (and restart it)")
    p.add_argument("--limit", type=int, default=0, metavar="N",
                   help="only the first N runs of each suite and model (0: all)")
    p.add_argument("--concurrency", type=int, default=4, metavar="N",
                   help="turns in flight at once")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every run's outcome here")
    args = p.parse_args(argv)
    if args.allow:
        if args.rules == "off" or args.kill_worker:
            p.error("--allow takes the rules on and no --kill-worker")
        try:
            flow_rules.relaxed(flow_rules.RULES, args.allow)
        except ValueError as e:
            p.error(str(e))
    return args


def plan(args: argparse.Namespace) -> list[tuple[suites.Pair, str]]:
    runs = []
    for suite_name in args.suite or suites.SUITES:
        for model in args.model or oracles.KINDS:
            pairs = suites.pairs(suite_name, injected=model == "compromised")
            runs += [(p, model) for p in pairs[:args.limit or None]]
    return runs


async def run(args: argparse.Namespace, data_dir: Path) -> tuple[list[runner.Outcome], str]:
    runs = plan(args)
    app = "app_with_rules" if args.rules == "on" else "app"
    # In process, workflow code runs outside Temporal's sandbox (the figures do
    # not depend on it; the CI test and --kill-worker's worker run it inside).
    built = apps.app_with_rules(args.allow) if args.allow else app
    stack = (ChildWorker(data_dir, app) if args.kill_worker
             else InProcess(data_dir, built, sandbox=False))
    async with stack:
        gate = asyncio.Semaphore(args.concurrency)
        done = 0
        # Kill points: spread over the run, each while turns are in flight.
        kill_at = {len(runs) * (k + 1) // (args.kill_worker + 1)
                   for k in range(args.kill_worker)}

        async def one(pair: suites.Pair, model: str) -> runner.Outcome:
            nonlocal done
            async with gate:
                outcome = await runner.run_pair(stack.client, stack.db, pair, model,
                                                args.reviewer)
            done += 1
            if done % 100 == 0:
                log.info("%d of %d runs", done, len(runs))
            if done in kill_at and isinstance(stack, ChildWorker):
                kill_at.discard(done)
                log.info("SIGKILL the worker after %d of %d runs", done, len(runs))
                await stack.kill_and_restart()
            return outcome

        outcomes = list(await asyncio.gather(*(one(p, m) for p, m in runs)))
        checked = ""
        if isinstance(stack, ChildWorker):
            checked = f"worker kills: {stack.kills}\n" + _check(stack)
    return outcomes, checked


def _check(stack: ChildWorker) -> str:
    """`turnstile check` on the run's database and Temporal server."""
    done = subprocess.run([sys.executable, "-m", "turnstile", "check"], env=stack.check_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    return f"turnstile check: exit {done.returncode}\n{done.stdout}{done.stderr}"


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    args = parse(argv)
    if args.rules is None:
        args.rules = "on" if flow_rules.available() else "off"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dojo-") as tmp:
        outcomes, checked = asyncio.run(run(args, Path(tmp)))
    out = sys.stdout
    out.write(f"AgentDojo {suites.VERSION}, attack {suites.ATTACK!r}, rules {args.rules}, "
              f"{'' if not args.allow else 'allowed ' + ', '.join(args.allow) + ', '}"
              f"reviewer {args.reviewer}, "
              f"{len(outcomes)} runs in {time.monotonic() - started:.0f} s\n")
    for line in figures.lines(outcomes):
        out.write(line + "\n")
    if checked:
        out.write(checked)
    for title, found in figures.failures(outcomes).items():  # each, even when none
        out.write(f"{title} ({len(found)}{', first 30' if len(found) > 30 else ''})"
                  f"{':' if found else ''}\n")
        out.writelines(f"  {line}\n" for line in found[:30])
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "summary": figures.summary(outcomes),
                                         "runs": figures.raw(outcomes)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
