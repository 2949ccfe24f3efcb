"""Worker processes of bench/turns.py for the two turns that are not
Turnstile's (Turnstile's own is `python worker.py --no-sender`):

    python -m bench.turn_workers minimal   # bench/minimal_turn.py
    python -m bench.turn_workers peer      # bench/peer_turn.py (pydantic-ai)

Environment: TEMPORAL_ADDRESS, TURNSTILE_TASK_QUEUE, BENCH_LLM_URL,
DATABASE_URL; BENCH_EVENT_LOOP `asyncio` (default: `asyncio.run`, as a
hand-written worker runs) or `uvloop` (the loop Turnstile's worker runs on,
turnstile/runtime/event_loop.py). Same activity slots as Turnstile's worker
(32). Runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from turnstile.runtime import event_loop

log = logging.getLogger("bench.turn_workers")
READY = "bench worker ready"


async def serve(kind: str) -> None:
    address, queue = os.environ["TEMPORAL_ADDRESS"], os.environ["TURNSTILE_TASK_QUEUE"]
    if kind == "minimal":
        from bench.minimal_turn import MinimalTurn, call_model, query_sales

        # The floor as a user would hand-write it: Temporal's default converter,
        # no interceptors, and (like Turnstile's worker by default) no sandbox.
        client = await Client.connect(address)
        worker = Worker(client, task_queue=queue, workflows=[MinimalTurn],
                        activities=[call_model, query_sales], max_concurrent_activities=32,
                        workflow_runner=UnsandboxedWorkflowRunner())
    elif kind == "peer":
        from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin

        from bench.peer_turn import temporal_agent
        from bench.peer_workflow import PeerTurn

        client = await Client.connect(address, plugins=[PydanticAIPlugin()])
        worker = Worker(client, task_queue=queue, workflows=[PeerTurn],
                        plugins=[AgentPlugin(temporal_agent)], max_concurrent_activities=32)
    else:
        raise SystemExit(f"unknown kind {kind!r}: minimal or peer")
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    async with worker:
        log.info("%s (%s on %s)", READY, kind, queue)
        await done.wait()


def main() -> None:
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kind = os.environ.get("BENCH_EVENT_LOOP") or "asyncio"
    event_loop.run(serve(sys.argv[1] if len(sys.argv) > 1 else ""), kind)


if __name__ == "__main__":
    main()
