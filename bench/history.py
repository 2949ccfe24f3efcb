"""What one Turnstile turn puts into its history, event by event.

    .venv/bin/python -m bench.history              # the plain turns and the bench turn
    .venv/bin/python -m bench.history --events     # also every event with its size

Starts a dev server (in memory, the speed flags of turnstile.runtime.devstack),
the scripted OpenAI-compatible model of bench/turns.py, a seeded SQLite
database and an in-process worker serving `sales-assistant` with its
defaults (memory, audit, retrieval, lock), then runs three turns:

- **plain, no tool**: the model answers at once (1 model call);
- **plain, one tool**: one `querySalesData`, then the answer (2 model calls,
  1 tool call) — the "plain turn" history goal (<= 30 events,
  <= 8 KB);
- **bench turn**: 3 model calls and 2 `querySalesData` (bench/turns.py's turn);
- **plain service, one add call**: a service with a one-line system prompt,
  no retrieval and the `add` tool of tests/support/services.py; one `add`
  call, then the answer: the turn v0.1's own bench measured (83 events,
  23.8 KB).

For each: events, bytes (each event's ByteSize()), activities and local
activities by name, and the biggest events.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.bench_support import LOCAL_ACTIVITY_MARKER, DevServer, connect
from bench.turns import scripted_model
from turnstile.engine.contract import WORKFLOW_TYPE, TurnInput, TurnResult, TurnStatus
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

TURNS = {"plain, no tool": 0, "plain, one tool": 1, "bench turn": 2}
ADD_TURN = "plain service, one add call"


def _name(e: Any) -> str:
    kind = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return f"{kind} {e.activity_task_scheduled_event_attributes.activity_type.name}"
    if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
        attrs = e.marker_recorded_event_attributes
        if attrs.marker_name == LOCAL_ACTIVITY_MARKER:
            data = attrs.details.get("data")
            label = data.payloads[0].data[:120].decode(errors="replace") if data else ""
            return f"{kind} local {label}"
        return f"{kind} {attrs.marker_name}"
    return kind


async def one_turn(client: Client, queue: str, fake: FakeOpenAIServer, queries: int | None,
                   show: bool) -> tuple[int, int, Counter[str]]:
    """`queries` None: the test service's turn (one `add` call, then the answer)."""
    if queries is None:
        fake.default = None
        fake.script(tool_reply(("call-1", "add", {"a": 1, "b": 2})), text_reply("3"))
        turn = TurnInput(conversation_id=f"hist-{uuid.uuid4().hex[:8]}", user_id="bench",
                         message="1+2?", service="plain", variables={"team": "qa"})
    else:
        fake.default = scripted_model(queries, answer="done")
        turn = TurnInput(conversation_id=f"hist-{uuid.uuid4().hex[:8]}", user_id="bench",
                         message="Which customers' sales exceeded 50,000 last week?",
                         service="sales-assistant")
    handle = await client.start_workflow(WORKFLOW_TYPE, turn, id=f"hist-{uuid.uuid4().hex[:8]}",
                                         task_queue=queue, result_type=TurnResult)
    result = await handle.result()
    if result.status != TurnStatus.COMPLETED:
        raise RuntimeError(f"turn ended {result.status}: {result.error}")
    history = await handle.fetch_history()
    kinds: Counter[str] = Counter()
    total = 0
    for e in history.events:
        size = e.ByteSize()
        total += size
        name = _name(e)
        if name.startswith("ACTIVITY_TASK_SCHEDULED") or name.startswith("MARKER_RECORDED local"):
            kinds[name.split(" ")[1] if "local" not in name else "local activity"] += 1
        if show:
            print(f"  {e.event_id:>3} {size:>6}  {name[:110]}")
    return len(history.events), total, kinds


async def main_async(args: argparse.Namespace) -> None:
    from tests.support.services import add
    from tests.support.turns import running_worker
    from turnstile.runtime.services import Service
    from turnstile.runtime.tools import ToolRegistry
    from turnstile.sales.seed import seed
    from turnstile.sales.service import build_sales_service
    from turnstile.stores.db import Database

    with tempfile.TemporaryDirectory(prefix="turnstile-history-") as tmp:
        db_url = f"sqlite:///{Path(tmp) / 'h.db'}"
        seed(Database(db_url), rows=args.rows)
        server = DevServer(Path(tmp) / "temporal.log")
        fake = FakeOpenAIServer()
        try:
            client = await connect(server.address)
            queue = f"history-{uuid.uuid4().hex[:6]}"
            plain = Service(name="plain", system_prompt="You are a test assistant for {{team}}.",
                            tools=ToolRegistry([add]))
            services = [build_sales_service(), plain]
            async with running_worker(client, queue, db_url, services,
                                      llm_url=fake.url,
                                      env={"TURNSTILE_DATA_DIR": tmp}):
                for label, queries in [*TURNS.items(), (ADD_TURN, None)]:
                    print(f"{label}:")
                    events, size, kinds = await one_turn(client, queue, fake, queries,
                                                         args.events)
                    print(f"  {events} events, {size:,} bytes; "
                          + ", ".join(f"{k} x{n}" for k, n in kinds.items()))
        finally:
            fake.close()
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", action="store_true", help="print every event")
    parser.add_argument("--rows", type=int, default=2000, help="sales rows seeded")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
