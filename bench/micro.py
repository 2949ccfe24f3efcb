"""Micro-benchmarks of the worker's per-turn helpers outside the workflow,
each as one call costs (µs, the minimum of several repeats), for the cuts
bench/README.md lists; `bench.profile_turn` measures the whole turn.

    .venv/bin/python -m bench.micro                 # every case
    .venv/bin/python -m bench.micro events heartbeat

Cases:

- `events`: a turn's two events (TurnStarted, TurnCompleted) through the
  worker's default listeners (a log line, a span), with the
  `turnstile.events` logger below INFO and no tracer provider installed
  (nothing emits either);
- `events-on`: the same with the logger at INFO into a discarding handler;
- `tool-span`: a tool call's span and outcome with no tracer provider;
- `db-reads`: what every memory write of a turn's run reads
  (`turnstile.stores.runs.claim`: the conversation's lock holder and the
  slots of an earlier run, one statement since 5 December 2026), on a
  SQLite file;
- `db-reads-sa`: the same through SQLAlchemy's execution path (the claim's
  statement is `prebuilt`: on SQLite the driver runs it directly,
  turnstile/stores/prebuilt.py);
- `memory`: what a model call reads of memory besides the claim
  (`MemoryStore.get` of its answer's slot, `tail` of a 12-message
  conversation for its window, with its images) and a write's watermark
  update (`lower_answered_through`), on a SQLite file;
- `journal`: a tool call's ledger claim, its completion and its audit
  row's close (turnstile.stores.journal_writes), on a SQLite file;
- `prior-calls`: a model call's read of its turn's superseded calls
  (`superseded.prior_calls`, before numbering its calls), as the call
  pays it: in a transaction of its own before the cut, in the one its
  answer is written in after (where `prior_calls` takes `conn`);
- `heartbeat`: `activities.runtime.with_heartbeat` around work that returns
  at once (its own cost per activity), in Temporal's ActivityEnvironment;
- `walks-sdk` / `walks-once`: a workflow completion that schedules an
  activity with two inputs (a short one, 5 KB) and completes with the 5 KB
  one, through the worker's converter: the SDK's `encode_completion` (three
  walks) and `turnstile.runtime.payload_visits.encode_completion` (one);
- `model-request` / `model-request-httpcore`: one model call's request
  through `OpenAICompatibleProvider.complete` to the scripted model server
  (kept alive), the sales turn's second request with its tools: the CPU of
  the calling thread per request, on the model transport
  (turnstile/providers/http_transport.py) and on httpx's default
  (httpcore over anyio); `-c20` variants: 20 requests at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta

from temporalio import activity
from temporalio.testing import ActivityEnvironment

from turnstile.engine.contract import TurnStatus
from turnstile.engine.events import TurnCompleted, TurnStarted
from turnstile.runtime.event_bus import EventBus
from turnstile.runtime.tracing import record_tool_outcome, tool_span

log = logging.getLogger("bench.micro")

WF = "sales-turn-3f1c9a2e-1b7d-4f0e-9c55-0a1b2c3d4e5f"
RUN = "0193a8f2-7c1d-7e0a-9b3c-5d6e7f8a9b0c"


def best_us(fn: Callable[[], object], number: int, repeat: int = 5) -> float:
    """The minimum over `repeat` runs of `number` calls, µs per call."""
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - began) / number * 1e6)
    return best


def _events() -> tuple[TurnStarted, TurnCompleted]:
    common = {"workflow_id": WF, "run_id": RUN, "conversation_id": "conv-ops@example.com",
              "user_id": "ops@example.com", "service": "sales-assistant",
              "at": "2026-12-05T08:00:00.000+00:00"}
    return (TurnStarted(event_id=f"{WF}/{RUN}/turn_started", **common),
            TurnCompleted(event_id=f"{WF}/{RUN}/turn_completed", status=TurnStatus.COMPLETED,
                          round_trips=3, tool_calls=2, duration_seconds=1.2, **common))


def events(emitting: bool) -> float:
    logger = logging.getLogger("turnstile.events")
    logger.propagate = False
    logger.handlers = [logging.NullHandler()] if emitting else []
    logger.setLevel(logging.INFO if emitting else logging.WARNING)
    bus, (started, completed) = EventBus(), _events()

    def publish() -> None:
        bus.publish(started)
        bus.publish(completed)
    return best_us(publish, 5_000)


def span() -> float:
    def one() -> None:
        with tool_span("querySalesData", "call_8f2a0c1d9e", 1) as s:
            record_tool_outcome(s, "completed", False)
    return best_us(one, 20_000)


async def _heartbeat() -> float:
    from turnstile.activities.runtime import with_heartbeat

    async def work() -> int:
        await asyncio.sleep(0)
        return 1

    async def wrapped() -> None:
        await with_heartbeat(work())

    async def bare() -> None:
        await work()

    best, n = float("inf"), 20_000
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(n):
            await wrapped()
        took = time.perf_counter() - began
        began = time.perf_counter()
        for _ in range(n):
            await bare()
        best = min(best, (took - (time.perf_counter() - began)) / n * 1e6)
    return best


def heartbeat() -> float:
    env = ActivityEnvironment()
    env.info = activity.Info(**{**env.info.__dict__,
                                "heartbeat_timeout": timedelta(seconds=30)})

    @activity.defn(name="bench_heartbeat")
    async def run() -> float:
        return await _heartbeat()
    return float(asyncio.run(env.run(run)))


def walks(once: bool) -> float:
    from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
    from temporalio.converter import StorageDriverStoreContext, StorageDriverWorkflowInfo

    from turnstile.runtime import client, payload_visits
    from turnstile.runtime.config import Settings

    dc = client.converter(Settings.from_env())._with_store_context(StorageDriverStoreContext(
        target=StorageDriverWorkflowInfo(id="w", run_id="r", type="AgentTurn",
                                         namespace="default")))
    small, big = dc.payload_converter.to_payloads(["a", "x" * 5000])
    done = WorkflowActivationCompletion(run_id="r")
    first = done.successful.commands.add().schedule_activity
    first.activity_id, first.activity_type = "1", "turnstile.call_model"
    first.arguments.extend([small, big])
    done.successful.commands.add().complete_workflow_execution.result.CopyFrom(big)
    encode = payload_visits.encode_completion if once else payload_visits.SDK_WALKS[1]

    async def run() -> float:
        best, n = float("inf"), 2_000
        for _ in range(5):
            began = time.perf_counter()
            for _ in range(n):
                await encode(done, dc, True, 1)
            best = min(best, (time.perf_counter() - began) / n * 1e6)
        return best
    return asyncio.run(run())


def model_request(transport: str = "ours", concurrency: int = 1) -> float:
    import json

    import httpx

    from turnstile.engine.messages import ChatMessage, ToolCall
    from turnstile.providers.base import ModelRequest
    from turnstile.providers.openai_compat import OpenAICompatibleProvider
    from turnstile.sales.documents import SALES_DOCUMENTS
    from turnstile.sales.service import SYSTEM_PROMPT, build_sales_service
    from turnstile.testing import FakeOpenAIServer, text_reply

    service = build_sales_service()
    tools = [t.spec for t in service.tools]
    policies = "\n\n".join(f"{d.title}: {d.text}" for d in SALES_DOCUMENTS)
    rows = [{"customerId": f"C{i:03d}", "name": f"Customer {i} GmbH",
             "total": f"{90_000 - i * 1_000:,}.00 EUR"} for i in range(10)]
    result = json.dumps({"customers": rows, "totalCount": 10, "returnedCount": 10})
    call = ToolCall(id="call_8f2a0c1d9e", name="querySalesData", arguments=json.dumps(
        {"startDate": "2026-11-23", "endDate": "2026-11-29", "minAmount": 50000}))
    request = ModelRequest(messages=[
        ChatMessage(role="system", content=SYSTEM_PROMPT),
        ChatMessage(role="user", content=f"{policies}\n\nFind customers whose sales "
                    "last week exceeded 50,000 and have ops@example.com follow up"),
        ChatMessage(role="assistant", content="", tool_calls=[call]),
        ChatMessage(role="tool", tool_call_id=call.id, content=result),
    ], tools=tools, max_tokens=1024, temperature=0.2)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its line per request: not here
    server = FakeOpenAIServer(keep_alive=True)
    server.default = text_reply("Found 10 customers above 50,000 last week: " + ", ".join(
        f"{r['name']} ({r['customerId']}, {r['total']})" for r in rows))

    async def run() -> float:
        provider = OpenAICompatibleProvider(server.url, model="bench-model")
        if transport == "httpcore":  # httpx's default transport, as before 5 December
            await provider.aclose()
            provider._client = httpx.AsyncClient(
                headers=provider._client.headers, timeout=provider._client.timeout,
                transport=httpx.AsyncHTTPTransport(retries=0))

        async def batch() -> None:
            await asyncio.gather(*(provider.complete(request) for _ in range(concurrency)))
        try:
            await batch()  # the connections, opened once
            best, n = float("inf"), max(1, 300 // concurrency)
            for _ in range(5):
                with server._lock:
                    server.requests.clear()
                began = time.thread_time()
                for _ in range(n):
                    await batch()
                best = min(best, (time.thread_time() - began) / (n * concurrency) * 1e6)
            assert not server.refusals, server.refusals
            return best
        finally:
            await provider.aclose()
    try:
        return asyncio.run(run())
    finally:
        server.close()


def db_reads(driver: bool = True) -> float:
    import tempfile

    from turnstile.stores import runs
    from turnstile.stores.db import Database
    from turnstile.stores.lock import Holder, hold
    from turnstile.stores.tables import metadata

    db = Database(f"sqlite:///{tempfile.mkdtemp()}/micro.db")
    metadata.create_all(db.engine)
    w = runs.Writer(WF, "", RUN, confirmed=True)
    with db.connect() as conn:
        hold(conn, "conv-1", Holder(WF, RUN, ""))
        conn_ = conn
        if not driver:  # SQLAlchemy's execution path, as before the prebuilt statements
            conn_._form = lambda *_: None  # type: ignore[method-assign]

        def reads() -> None:
            runs._read(conn_, "conv-1", w, range(4, 6), None)
        return best_us(reads, 5_000)


def memory_reads() -> float:
    import tempfile

    from turnstile.engine.messages import ChatMessage
    from turnstile.stores.db import Database
    from turnstile.stores.memory import MemoryStore, lower_answered_through
    from turnstile.stores.tables import metadata

    db = Database(f"sqlite:///{tempfile.mkdtemp()}/micro.db")
    metadata.create_all(db.engine)
    store = MemoryStore(db)
    store.check_owner("conv-1", "u1")
    store.append("conv-1", 0, [ChatMessage(role="system", content="be brief")] + [
        ChatMessage(role="user" if i % 2 else "assistant", content=f"message {i}")
        for i in range(1, 12)], WF)
    with db.connect() as conn:
        conn_ = conn

        def reads() -> None:
            store.get("conv-1", 11, conn_)
            store.tail("conv-1", WF, lambda _: True, conn_)
            lower_answered_through(conn_, "conv-1", 12)
        return best_us(reads, 2_000)


def journal() -> float:
    import itertools
    import tempfile

    from turnstile.engine.contract import AuditStatus, CallStatus
    from turnstile.stores import journal_writes as w
    from turnstile.stores.call_key import CallKey
    from turnstile.stores.db import Database
    from turnstile.stores.tables import metadata

    db = Database(f"sqlite:///{tempfile.mkdtemp()}/micro.db")
    metadata.create_all(db.engine)
    ids = itertools.count()
    with db.connect() as conn:
        conn_ = conn

        def call() -> None:
            key = CallKey(WF, "", f"call_{next(ids)}")
            w.claim_first(conn_, key, "querySalesData")
            w.complete(conn_, key, 1, outcome=CallStatus.COMPLETED, result="[]",
                       is_error=False, state=None)
            w.close_audit(conn_, key.execution_id, AuditStatus.COMPLETED, None)
        return best_us(call, 2_000)


def prior_calls() -> float:
    import inspect
    import tempfile

    from turnstile.stores import superseded
    from turnstile.stores.db import Database
    from turnstile.stores.tables import metadata

    db = Database(f"sqlite:///{tempfile.mkdtemp()}/micro.db")
    metadata.create_all(db.engine)
    joins = "conn" in inspect.signature(superseded.prior_calls).parameters
    with db.connect() as conn:
        conn_ = conn

        def read() -> None:
            if joins:
                superseded.prior_calls(db, "conv-1", WF, RUN, conn=conn_)
            else:
                superseded.prior_calls(db, "conv-1", WF, RUN)
        return best_us(read, 5_000)


CASES: dict[str, Callable[[], float]] = {
    "events": lambda: events(False),
    "events-on": lambda: events(True),
    "tool-span": span,
    "db-reads": db_reads,
    "db-reads-sa": lambda: db_reads(driver=False),
    "memory": memory_reads,
    "journal": journal,
    "prior-calls": prior_calls,
    "heartbeat": heartbeat,
    "walks-sdk": lambda: walks(False),
    "walks-once": lambda: walks(True),
    "model-request": model_request,
    "model-request-httpcore": lambda: model_request("httpcore"),
    "model-request-c20": lambda: model_request("ours", 20),
    "model-request-c20-httpcore": lambda: model_request("httpcore", 20),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help=f"of {', '.join(CASES)} (default: all)")
    args = parser.parse_args()
    unknown = set(args.cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in args.cases or CASES:
        log.info("%-10s %8.1f µs per call (min of 5)", name, CASES[name]())


if __name__ == "__main__":
    main()
