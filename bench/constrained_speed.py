"""One model request, constrained and not: how fast each server generates.

    nice -n 19 .venv/bin/python -m bench.constrained_speed --server llama-cpp-python \\
        --request bench/results/real_model/sales-compact-first-request.json \\
        --json bench/results/real_model/constrained-speed-llama-cpp-python.json

`--request` is a request body as the worker sent it in a bench.real_model run
(kept by bench/model_requests.py under .data/bench-real-model/*/requests/):
the sales turn's first request with `constrain_tool_calls`, i.e. a
`response_format` of type `json_object` with the calls-or-answer schema and
no `tools`. It is sent to a fresh server (bench/local_servers.py) as it is
("constrained") and without its `response_format` ("unconstrained": the same
messages, max_tokens and temperature), alternately, `--repeat` times each,
through the recording proxy, which takes from the server the prompt tokens it
read and the tokens it generated with their times (llama-server's `timings`,
llama-cpp-python's perf log lines). The first request reads the whole
prompt; later ones find it in the server's cache, so the generation rates
compare the sampling alone. `--max-tokens` bounds each reply (default: the
request's own).
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.local_servers import MODELS, SERVERS, ModelServer, ensure_model
from bench.model_requests import RequestRecorder
from bench.real_model import DATA, commit_of

ROOT = Path(__file__).resolve().parent.parent


def variants(body: dict[str, Any], max_tokens: int | None) -> dict[str, dict[str, Any]]:
    """The request as sent (constrained) and without its response_format."""
    if "response_format" not in body:
        raise SystemExit("--request: not a constrained request (no response_format)")
    sent = {k: v for k, v in body.items() if not k.startswith("_")}
    if max_tokens is not None:
        sent["max_tokens"] = max_tokens
    plain = {k: v for k, v in sent.items() if k != "response_format"}
    return {"constrained": sent, "unconstrained": plain}


def measure(kind: str, model: Path, bodies: dict[str, dict[str, Any]], repeat: int,
            threads: int, context: int, timeout: float) -> list[dict[str, Any]]:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    workdir = DATA / f"speed-{kind}-{stamp}"
    alias = MODELS["1.5b"].name
    server = ModelServer(kind, model, workdir / f"{kind}.log", context=context,
                         threads=threads, alias=alias)
    out: list[dict[str, Any]] = []
    try:
        with RequestRecorder(server.url, log=server.log, cpu=server.cpu_seconds) as proxy:
            for i in range(repeat):
                for name, body in bodies.items():
                    answer = httpx.post(f"{proxy.url}/chat/completions",
                                        json={**body, "model": alias}, timeout=timeout)
                    (record,) = proxy.take()
                    row = {"server": kind, "variant": name, "round": i + 1, **record.as_dict()}
                    content = ""
                    if answer.status_code == 200:
                        content = answer.json()["choices"][0]["message"].get("content") or ""
                    row["reply"] = content[:400]
                    out.append(row)
                    print(f"{kind} {name} #{i + 1}: {row['seconds']:.1f} s wall, prompt "
                          f"{row['prompt_tokens']} ({row['prompt_evaluated']} read in "
                          f"{row['prompt_seconds']} s), {row['completion_tokens']} completion "
                          f"tokens, {row['generation_tokens_per_second']} tok/s generating, "
                          f"{row['tokens_per_second']} tok/s wall, finish "
                          f"{row['finish_reason']}: {json.dumps(content[:120])}", flush=True)
    finally:
        server.stop()
    return out


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per server and variant: median generation tok/s (the server's timings)
    and median wall tok/s of the requests that found the prompt cached."""
    out = []
    for key in dict.fromkeys((r["server"], r["variant"]) for r in rows):
        mine = [r for r in rows if (r["server"], r["variant"]) == key]
        gen = [r["generation_tokens_per_second"] for r in mine
               if r["generation_tokens_per_second"]]
        out.append({"server": key[0], "variant": key[1], "requests": len(mine),
                    "median_generation_tokens_per_second":
                        round(statistics.median(gen), 3) if gen else None,
                    "completion_tokens": [r["completion_tokens"] for r in mine],
                    "generation_seconds": [r["generation_seconds"] for r in mine]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=[*SERVERS, "both"], default="llama-cpp-python")
    parser.add_argument("--request", type=Path, required=True,
                        help="a request body as the worker sent it (JSON)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--timeout", type=float, default=3000.0, help="seconds per request")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    bodies = variants(json.loads(args.request.read_text()), args.max_tokens)
    model = ensure_model("1.5b")
    kinds = list(SERVERS) if args.server == "both" else [args.server]
    rows: list[dict[str, Any]] = []
    for kind in kinds:
        rows += measure(kind, model, bodies, args.repeat, args.threads, args.context,
                        args.timeout)
    totals = summary(rows)
    print("\nserver | variant | requests | median tok/s generating | completion tokens")
    print("---|---|---|---|---")
    for t in totals:
        print(f"{t['server']} | {t['variant']} | {t['requests']} | "
              f"{t['median_generation_tokens_per_second']} | {t['completion_tokens']}")
    if args.json:
        args.json.write_text(json.dumps({
            "bench": "bench.constrained_speed",
            "command": ".venv/bin/python -m bench.constrained_speed --server "
                       f"{args.server} --request {args.request} --repeat {args.repeat}"
                       + (f" --max-tokens {args.max_tokens}" if args.max_tokens else "")
                       + f" --threads {args.threads}",
            "measured": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit_of(ROOT), "model": MODELS["1.5b"].file,
            "summary": totals, "requests": rows}, indent=1))


if __name__ == "__main__":
    main()
