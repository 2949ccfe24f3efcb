"""Chaos: concurrent sales turns with approvals while the worker is SIGKILLed
at random moments and restarted.

    python bench/chaos.py --turns 40 --minutes 10
    python bench/chaos.py --turns 1000 --in-flight 8 --minutes 10   # turns all along

Needs a Temporal server at TEMPORAL_ADDRESS (e.g. `make up`'s). Runs its own
worker processes (worker + e-mail sender, offline demo planner), a local SMTP
server and a fresh SQLite database in a temporary directory. Afterwards:
every turn closed, no Message-ID received twice, and `starter.py check`'s
truth check reports nothing. Hostile input is mixed in (`--hostile`, a share
of the turns): ids and messages that break the door's rules (NUL, zero-width
and control characters, an overlong id, a message over the limit), each of
which must end `refused` (InvalidTurnInput); and the reviewer first tries to
approve as the requester respelled ("ＡＬＩＣＥ", "alice\u200b"), which must never
be applied. Prints turns, kills, mails and disagreements;
exit status 1 when any of them is wrong. E-mail tasks parked as "possibly
sent" (the sender was killed while delivering: never retried on its own, so
never sent twice; turnstile/outbox/store.py) are counted apart. tests/test_chaos.py runs a short
version.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from temporalio.client import Client, WorkflowHandle  # noqa: E402

from tests.support.processes import free_port  # noqa: E402
from tests.support.sql import fetchall  # noqa: E402
from tests.support.worker_process import WorkerProcess  # noqa: E402
from turnstile.engine.contract import (  # noqa: E402
    WORKFLOW_TYPE,
    ApproveSignal,
    PendingApproval,
    TurnInput,
    TurnResult,
)
from turnstile.engine.identity import same_person  # noqa: E402
from turnstile.sales.outbox import POSSIBLY_SENT  # noqa: E402
from turnstile.sales.seed import seed  # noqa: E402
from turnstile.sales.smtp_server import LocalSmtpServer, read_mailbox  # noqa: E402
from turnstile.sales.truth import disagreements  # noqa: E402
from turnstile.stores.db import Database  # noqa: E402
from turnstile.stores.schema import upgrade  # noqa: E402

DEMO = "Find customers whose sales last week exceeded 50,000 and email ops@example.com to follow up"
# Inputs the door refuses: (conversation suffix, user id, message).
HOSTILE = [
    ("nul", "alice", DEMO + "\x00"),
    ("zw", "ali\u200bce", DEMO),
    ("ctl", "alice\x1b[2J", DEMO),
    ("long" + "x" * 200, "alice", DEMO),
    ("big", "alice", "x" * 100_001),
]
# The requester, respelled: refused as a reviewer of her own calls.
SELF_REVIEWERS = ["\uff21\uff2c\uff29\uff23\uff25", "alice\u200b", " Alice "]
SETTLED_MAIL = ("SENT", "DEAD", "CANCELLED")
log = logging.getLogger("bench.chaos")


@dataclass
class ChaosReport:
    turns: int = 0
    closed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    kills: int = 0
    mails: int = 0
    duplicate_mails: int = 0
    unsettled_mails: int = 0
    unsettled_statuses: dict[str, int] = field(default_factory=dict)
    # FAILED as "possibly sent": the sender was killed while delivering, so the
    # task is parked for a person instead of risking a second copy (outbox).
    possibly_sent: int = 0
    disagreements: list[str] = field(default_factory=list)
    hostile: int = 0  # turns started with input the door must refuse
    hostile_not_refused: int = 0
    self_approved: int = 0  # decisions taken by the requester under another spelling
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.closed == self.turns and self.duplicate_mails == 0
                and self.unsettled_mails == 0 and not self.disagreements
                and self.hostile_not_refused == 0 and self.self_approved == 0)


async def _approve_all(client: Client, turns: list[_Turn], done: asyncio.Event) -> None:
    """A reviewer who approves whatever is pending (the worker may be dead: retry)."""
    while not done.is_set():
        for h in [t.handle for t in list(turns)]:
            try:
                pending = await h.query("pending_approvals", result_type=list[PendingApproval],
                                        rpc_timeout=timedelta(seconds=2))
                for p in pending:
                    for reviewer in [*SELF_REVIEWERS, "ops-lead"]:  # the first ones are refused
                        await h.signal("approve", ApproveSignal(tool_call_id=p.tool_call_id,
                                                                reviewer=reviewer))
            except Exception:  # noqa: BLE001 - a dead worker or a closed turn: try later
                continue
        await asyncio.sleep(0.3)


async def _keep_starting(client: Client, task_queue: str, handles: list[Any],
                         turns: int, in_flight: int, deadline: float,
                         hostile_every: int = 0) -> None:
    """Start turns for the whole run: `in_flight` open at a time (0: all at
    once), until `turns` were started or the deadline passed."""
    i = 0
    while i < turns and time.monotonic() < deadline:
        open_turns = 0
        for h in handles:
            if not h.closed:
                try:
                    desc = await h.handle.describe(rpc_timeout=timedelta(seconds=2))
                except Exception:  # noqa: BLE001 - the server is busy: count it open
                    open_turns += 1
                    continue
                h.closed = desc.close_time is not None
                open_turns += not h.closed
        while i < turns and (in_flight == 0 or open_turns < in_flight):
            hostile = hostile_every > 0 and i % hostile_every == hostile_every - 1
            suffix, user, message = (HOSTILE[(i // max(hostile_every, 1)) % len(HOSTILE)]
                                     if hostile else ("", "alice", DEMO))
            turn = TurnInput(conversation_id=f"c-chaos-{i}{suffix}", user_id=user,
                             message=message, service="sales-assistant")
            handles.append(_Turn(await client.start_workflow(
                WORKFLOW_TYPE, turn, id=f"{task_queue}-{i}", task_queue=task_queue,
                result_type=TurnResult), hostile=hostile))
            i += 1
            open_turns += 1
        await asyncio.sleep(0.5)


@dataclass
class _Turn:
    handle: WorkflowHandle[Any, TurnResult]
    hostile: bool = False
    closed: bool = False


async def run_chaos(client: Client, address: str, workdir: Path, *, turns: int,
                    seconds: float, seed_value: int = 12, in_flight: int = 0,
                    close_budget: float = 600.0, hostile_every: int = 4,
                    min_kills: int = 0, calm_turns: int = 0) -> ChaosReport:
    """`calm_turns`: turns started after the last kill, whose e-mails a live
    sender delivers (a kill between a sender's claim and its send parks every
    claimed e-mail as possibly sent, so the chaotic turns alone may deliver none)."""
    rng = random.Random(seed_value)
    started = time.monotonic()
    task_queue = f"chaos-{uuid.uuid4().hex[:8]}"
    db_url = f"sqlite:///{workdir}/chaos.db"
    db = Database(db_url)
    upgrade(db)
    seed(db, rows=2000)
    port = free_port()
    env = {"TEMPORAL_ADDRESS": address, "TURNSTILE_TASK_QUEUE": task_queue,
           "DATABASE_URL": db_url, "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(port),
           "TURNSTILE_SENDER_STALE_SECONDS": "5", "TURNSTILE_DATA_DIR": str(workdir)}
    report = ChaosReport(turns=turns)
    mail_dir = workdir / "mail"
    with LocalSmtpServer(mail_dir, port=port):
        worker = WorkerProcess(workdir / "worker.log", env, args=()).start()
        try:
            started_turns: list[_Turn] = []
            deadline = time.monotonic() + seconds
            starter = asyncio.create_task(_keep_starting(client, task_queue, started_turns,
                                                         turns, in_flight, deadline,
                                                         hostile_every))
            done = asyncio.Event()
            approver = asyncio.create_task(_approve_all(client, started_turns, done))
            # Killing goes on past the deadline until `min_kills` (a slow
            # machine's worker takes seconds to start again after each kill).
            while time.monotonic() < deadline or report.kills < min_kills:
                await asyncio.sleep(rng.uniform(0.3, 2.0))
                worker.kill()
                report.kills += 1
                worker = WorkerProcess(workdir / "worker.log", env, args=()).start()
            await starter
            for k in range(calm_turns):
                turn = TurnInput(conversation_id=f"c-chaos-calm-{k}", user_id="alice",
                                 message=DEMO, service="sales-assistant")
                started_turns.append(_Turn(await client.start_workflow(
                    WORKFLOW_TYPE, turn, id=f"{task_queue}-calm-{k}", task_queue=task_queue,
                    result_type=TurnResult)))
            handles = [t.handle for t in started_turns]
            report.turns = len(handles)
            # A worker killed during a model request or a tool leaves that
            # attempt to its heartbeat timeout (5 s; a tool without heartbeats
            # to its start-to-close timeout), and its next workflow task to the
            # sticky queue's timeout: the budget covers such waits, not a hang.
            outcomes = await asyncio.wait_for(asyncio.gather(
                *(h.result() for h in handles), return_exceptions=True), close_budget)
            results = [o for o in outcomes if isinstance(o, TurnResult)]
            for h, o in zip(handles, outcomes, strict=True):
                if not isinstance(o, TurnResult):
                    log.error("turn %s did not close: %r", h.id, o)
            done.set()
            await approver
            report.closed = len(results)
            report.statuses = dict(Counter(r.status.value for r in results))
            for t, o in zip(started_turns, outcomes, strict=True):
                if t.hostile:
                    report.hostile += 1
                    refused = isinstance(o, TurnResult) and o.status.value == "refused" \
                        and o.error is not None and o.error.type == "InvalidTurnInput"
                    report.hostile_not_refused += not refused
            for _ in range(120):  # the sender delivers what the turns queued
                with db.connect() as conn:
                    rows = fetchall(conn, "SELECT status, attempts, last_error FROM email_task")
                if all(r["status"] in SETTLED_MAIL for r in rows):
                    break
                await asyncio.sleep(0.5)
            parked = [r for r in rows if r["status"] == "FAILED"
                      and (r["last_error"] or "").startswith(POSSIBLY_SENT)]
            report.possibly_sent = len(parked)
            unsettled = [r for r in rows if r["status"] not in SETTLED_MAIL and r not in parked]
            report.unsettled_mails = len(unsettled)
            report.unsettled_statuses = dict(Counter(r["status"] for r in unsettled))
            for r in unsettled:
                log.error("unsettled e-mail task: %s", dict(r))
        finally:
            worker.stop()
        ids = [m["Message-ID"] for m in read_mailbox(mail_dir)]
        report.mails = len(ids)
        report.duplicate_mails = sum(n - 1 for n in Counter(ids).values() if n > 1)
        report.disagreements = disagreements(db)
        with db.connect() as conn:
            reviewers = [r["reviewer"] for r in fetchall(conn,
                "SELECT reviewer FROM approval_decision")]
        report.self_approved = sum(1 for r in reviewers if same_person(r, "alice"))
    report.seconds = round(time.monotonic() - started, 1)
    return report


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--hostile", type=int, default=4, metavar="N",
                        help="every Nth turn starts with input the door must refuse (0: none)")
    parser.add_argument("--in-flight", type=int, default=0,
                        help="turns open at a time, new ones started as others close, for "
                             "the whole run (0: all --turns at once)")
    args = parser.parse_args(argv)
    from turnstile.runtime.client import connect
    from turnstile.runtime.config import Settings

    settings = Settings.from_env()
    client = await connect(settings)
    with tempfile.TemporaryDirectory(prefix="turnstile-chaos-") as tmp:
        report = await run_chaos(client, settings.temporal_address, Path(tmp), turns=args.turns,
                                 seconds=args.minutes * 60, seed_value=args.seed,
                                 in_flight=args.in_flight, hostile_every=args.hostile)
    sys.stdout.write(json.dumps(asdict(report), indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
