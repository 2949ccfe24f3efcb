"""Start and follow turns from a terminal.

    python starter.py seed [--rows N]
    python starter.py run "<message>" [--conversation ID] [--user ID] [--service S]
    python starter.py status|pending WORKFLOW_ID
    python starter.py stream WORKFLOW_ID   (partial model text of a streaming service)
    python starter.py approve|reject WORKFLOW_ID TOOL_CALL_ID --reviewer NAME [--note TEXT]
    python starter.py inbox [--host 127.0.0.1] [--port 8234]   (the approvals inbox)
    python starter.py audit [--since 1h] [--tool T] [--user U] [--status S] [--limit N]
                            [--top [--over N] | --failures] [--json]
    python starter.py usage [--since 7d|ISO] [--until ISO] [--user U] [--service S] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shlex
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from temporalio.client import Client

from turnstile.client import (
    ApprovalRefused,
    ClientError,
    TurnHandle,
    TurnNotFound,
    TurnstileClient,
)
from turnstile.engine.contract import (
    PendingApproval,
    TurnInput,
    TurnResult,
)
from turnstile.runtime import log_masking
from turnstile.runtime.client import TemporalUnreachable, connect, web_ui_url
from turnstile.runtime.config import Settings
from turnstile.stores.schema import upgrade


def out(text: str = "") -> None:
    """CLI output (this is the program's interface, not a log)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def signal_command(workflow_id: str, p: PendingApproval, reviewer: str,
                   name: str = "approve") -> str:
    """A command a reviewer can paste: every value shell-quoted, so a hostile
    call id or workflow id is data, never shell code."""
    payload = json.dumps({"tool_call_id": p.tool_call_id, "reviewer": reviewer})
    return shlex.join(["temporal", "workflow", "signal", "--workflow-id", workflow_id,
                       "--name", name, "--input", payload])


async def review_command(turns: TurnstileClient, workflow_id: str, approved: bool,
                         call_id: str, reviewer: str, note: str) -> int:
    """`approve`/`reject` through the `review` update (turnstile.client): print
    the decision that took effect, or the refusal and its reason (exit 1) —
    never "sent"."""
    verb = "approve" if approved else "reject"
    try:
        taken = await turns.review(workflow_id, call_id, approved, reviewer, note)
    except ApprovalRefused as err:
        out(f"{verb} refused for {call_id}: {err.reason}")
        return 1
    except TurnNotFound as err:  # no such turn, or it has ended
        out(f"{verb} refused for {call_id}: {err}")
        return 1
    verdict = "approved" if taken.approved else "rejected"
    out(f"{taken.tool_name} {taken.tool_call_id} {verdict} by {taken.reviewer} "
        f"at {taken.decided_at}")
    return 0


def describe_pending(p: PendingApproval) -> list[str]:
    """What a reviewer must see: the fields that matter first, then every
    argument in full (never cut off), then the notes."""
    checked = "validated" if p.validated else "NOT validated yet"
    lines = [f"  waiting for approval of {p.tool_name} (call {p.tool_call_id!r}, "
             f"arguments {checked}, deadline {p.deadline})"]
    for field, value in p.highlights.items():
        lines.append(f"    >> {field}: {json.dumps(value, ensure_ascii=False)}")
    lines.append("    arguments: " + json.dumps(p.arguments, ensure_ascii=False, indent=2)
                 .replace("\n", "\n    "))
    lines += [f"    !! {note}" for note in p.notes]
    return lines


async def follow(turn: TurnHandle, turns: TurnstileClient,
                 auto_approve: str | None = None, poll: float = 0.25) -> TurnResult:
    """Print each step and tool call as it happens; return the result."""
    seen, announced = 0, set()
    result_task = asyncio.ensure_future(turn.result())
    while not result_task.done():
        try:
            progress = await turn.status()
        except Exception:  # noqa: BLE001 - not yet queryable (no workflow task run yet)
            progress = None
        if progress:
            for ev in progress.events[seen:]:
                out(f"  [{ev.step}] {ev.detail}")
            seen = len(progress.events)
            for p in progress.pending_approvals:
                if p.tool_call_id in announced:
                    continue
                announced.add(p.tool_call_id)
                for line in describe_pending(p):
                    out(line)
                out(f"  approve with:\n    {signal_command(turn.id, p, auto_approve or 'YOU')}")
                out(f"  reject with:\n    "
                    f"{signal_command(turn.id, p, auto_approve or 'YOU', 'reject')}")
                if auto_approve:
                    out(f"  (demo: approving as {auto_approve!r})")
                    await review_command(turns, turn.id, True, p.tool_call_id, auto_approve,
                                         "approved by the make run demo")
        await asyncio.wait([result_task], timeout=poll)
    result = result_task.result()
    final = await turn.status()
    for ev in final.events[seen:]:
        out(f"  [{ev.step}] {ev.detail}")
    return result


def print_result(result: TurnResult, settings: Settings) -> None:
    out()
    out(f"status: {result.status.value}   round trips: {result.round_trips}   "
        f"provider: {result.provider}")
    for c in result.tool_calls:
        flag = " (error)" if c.is_error else ""
        out(f"  tool {c.name} [{c.status.value}]{flag} {json.dumps(c.arguments)[:160]}")
    if result.error:
        out(f"error: {result.error.type}: {result.error.message}")
    out()
    out(f"answer:\n{result.answer}")
    out()
    out(f"Web UI: {web_ui_url(settings, result.workflow_id)}")


async def stream_turn(turn: TurnHandle, settings: Settings) -> None:
    """Follow `turn_stream` (step 8) until the turn has ended."""
    from turnstile.stores.db import Database
    from turnstile.stores.streaming import follow_stream

    async def running() -> bool:
        return await turn.running()

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
    await follow_stream(db, turn.id, running, write)
    out()


def audit_command(db: Any, args: argparse.Namespace) -> int:
    """`starter.py audit`: the rows or summary asked for, as a table or JSON lines."""
    from turnstile.stores import audit_queries as q

    try:
        since_text = args.since or ("1h" if args.top or args.failures else None)
        f = q.AuditFilter(
            since=q.parse_since(since_text) if since_text else None,
            until=q.parse_since(args.until) if args.until else None,
            tool=args.tool, user=args.user, status=args.status)
    except ValueError as exc:
        sys.stderr.write(f"starter.py audit: {exc}\n")
        return 2
    rows: Sequence[q.Answer]
    if args.top:
        rows = q.top_callers(db, f, over=args.over, limit=args.limit)
        columns = ["user_id", "tool_name", "calls"]
    elif args.failures:
        rows = q.failures_by_category(db, f)
        columns = ["category", "failures", "tools", "latest"]
    else:
        rows = q.calls(db, f, limit=args.limit)
        columns = ["start_time", "user_id", "tool_name", "status", "workflow_id",
                   "error_message"]
    window = f"since {q.stored_time(f.since)}" if f.since else "all time"
    if args.json:
        for r in rows:
            out(json.dumps(r._asdict(), default=str))
        return 0
    out(f"{len(rows)} row(s), {window}")
    if rows:
        cells = [[str(getattr(r, col) if getattr(r, col) is not None else "")[:60]
                  for col in columns] for r in rows]
        widths = [max(len(col), *(len(line[i]) for line in cells))
                  for i, col in enumerate(columns)]
        out("  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True)))
        for line in cells:
            out("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    return 0


def usage_command(db: Any, args: argparse.Namespace) -> int:
    """`starter.py usage`: model tokens per (user, service, model), as an
    aligned table (numbers right-aligned, a total line) or JSON lines."""
    from turnstile.stores import audit_queries as q, usage

    try:
        f = usage.UsageFilter(
            since=q.parse_since(args.since) if args.since else None,
            until=q.parse_since(args.until) if args.until else None,
            user=args.user, service=args.service)
    except ValueError as exc:
        sys.stderr.write(f"starter.py usage: {exc}\n")
        return 2
    rows = usage.summary(db, f)
    if args.json:
        for r in rows:
            out(json.dumps(r))
        return 0
    window = f"since {usage.stored_time(f.since)}" if f.since else "all time"
    if f.until:
        window += f", until {usage.stored_time(f.until)}"
    out(f"{len(rows)} row(s), {window}")
    if not rows:
        return 0
    columns = list(usage.SUMMARY_COLUMNS)
    numeric = {"turns", "model_calls", "prompt_tokens", "completion_tokens"}
    total = {col: sum(r[col] for r in rows) for col in numeric}
    lines = [[f"{r[col]:,}" if col in numeric else str(r[col])[:40] for col in columns]
             for r in rows]
    lines.append(["total", "", "", *(f"{total[col]:,}" for col in columns[3:])])
    widths = [max(len(col), *(len(line[i]) for line in lines)) for i, col in enumerate(columns)]

    def row(cells: list[str]) -> str:
        return "  ".join(v.rjust(w) if col in numeric else v.ljust(w)
                         for col, v, w in zip(columns, cells, widths, strict=True)).rstrip()

    out(row(columns))
    for line in lines:
        out(row(line))
    return 0


async def main(argv: list[str] | None = None, client: Client | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_seed = sub.add_parser("seed", help="create the schema and fill sales_record")
    p_seed.add_argument("--rows", type=int, default=5000)
    p_run = sub.add_parser("run", help="start a turn and follow it")
    p_run.add_argument("message")
    p_run.add_argument("--conversation", default=None)
    p_run.add_argument("--user", default="alice")
    p_run.add_argument("--service", default="sales-assistant")
    p_run.add_argument("--workflow-id", default=None)
    p_run.add_argument("--auto-approve", metavar="REVIEWER", default=None,
                       help="approve pending tool calls as REVIEWER (demo)")
    p_run.add_argument("--no-follow", action="store_true")
    p_run.add_argument("--show-effects", action="store_true",
                       help="afterwards, show the e-mail tasks, mails and audit rows (demo)")
    for name in ("status", "pending"):
        sub.add_parser(name).add_argument("workflow_id")
    sub.add_parser("stream", help="print a turn's partial model output as it arrives "
                   "(services with streaming on)").add_argument("workflow_id")
    for name in ("approve", "reject"):
        p = sub.add_parser(name)
        p.add_argument("workflow_id")
        p.add_argument("tool_call_id")
        p.add_argument("--reviewer", required=True)
        p.add_argument("--note", default="")
    p_audit = sub.add_parser("audit", help="ask the audit log: calls, --top callers, --failures")
    p_audit.add_argument("--since", default=None,
                         help="window start: 1h, 30m, 7d, or an ISO time (summaries: 1h)")
    p_audit.add_argument("--until", default=None, help="window end (ISO time); default now")
    p_audit.add_argument("--tool", default=None)
    p_audit.add_argument("--user", default=None)
    p_audit.add_argument("--status", default=None, help="INITIATED, COMPLETED, FAILED, ...")
    p_audit.add_argument("--limit", type=int, default=50)
    summary = p_audit.add_mutually_exclusive_group()
    summary.add_argument("--top", action="store_true",
                         help="calls per user and tool in the window, most first")
    summary.add_argument("--failures", action="store_true",
                         help="failed calls in the window by error category")
    p_audit.add_argument("--over", type=int, default=0,
                         help="with --top: only pairs with more than this many calls")
    p_audit.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p_usage = sub.add_parser("usage", help="model tokens per user, service and model: turns, "
                             "model calls, prompt and completion tokens")
    p_usage.add_argument("--since", default=None,
                         help="window start: 1h, 7d, or an ISO time; default all time")
    p_usage.add_argument("--until", default=None, help="window end (ISO time); default now")
    p_usage.add_argument("--user", default=None)
    p_usage.add_argument("--service", default=None)
    p_usage.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p_inbox = sub.add_parser("inbox", help="the approvals inbox in the browser")
    p_inbox.add_argument("--host", default="127.0.0.1")
    p_inbox.add_argument("--port", type=int, default=8234)
    p_check = sub.add_parser("check", help="compare memory, journal, audit, approvals and "
                             "the world tables; exit 1 on any disagreement or anything "
                             "awaiting repair, 2 if Temporal cannot say whether a lock's "
                             "holder runs")
    p_check.add_argument("--conversation", default=None)
    args = parser.parse_args(argv)
    settings = Settings.from_env()

    if args.cmd == "inbox":
        from turnstile.inbox.app import serve

        await asyncio.to_thread(serve, args.host, args.port)
        return 0

    if args.cmd == "audit":
        from turnstile.stores.db import Database, dispose_engines

        db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
        try:
            return await asyncio.to_thread(audit_command, db, args)
        finally:
            dispose_engines()

    if args.cmd == "usage":
        from turnstile.stores.db import Database, dispose_engines

        db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
        try:
            return await asyncio.to_thread(usage_command, db, args)
        finally:
            dispose_engines()

    if args.cmd == "check":
        from turnstile.sales.check import check
        from turnstile.stores.db import Database

        async def temporal() -> Client:  # asked only about locked conversations
            return client or await connect(settings)

        db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
        # Consistent but worth a person's look ("note:"), e.g. the effect of a
        # call a reset run superseded; a running turn's conversation, "skipped:".
        report = await check(db, temporal, args.conversation)
        for line in report.lines():
            out(line)
        return report.exit_code

    if args.cmd == "seed":
        from turnstile.sales.seed import seed
        from turnstile.stores.db import Database

        db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
        upgrade(db)
        n = seed(db, rows=args.rows)
        out(f"seeded {n} sales records into {db.dialect} ({settings.database_url})")
        return 0

    # Every call to a turn goes through turnstile.client.
    turns = TurnstileClient(client or await connect(settings), settings)
    if args.cmd == "run":
        turn = TurnInput(conversation_id=args.conversation or f"c-{uuid.uuid4().hex[:8]}",
                         user_id=args.user, message=args.message, service=args.service)
        started = await turns.start_turn(turn, args.workflow_id)
        out(f"started {started.id} (conversation {turn.conversation_id})")
        out(f"Web UI: {web_ui_url(settings, started.id)}")
        if args.no_follow:
            return 0
        result = await follow(started, turns, auto_approve=args.auto_approve)
        print_result(result, settings)
        if args.show_effects and turn.service == "sales-assistant":
            from turnstile.sales.report import report_effects
            from turnstile.stores.db import Database

            db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
            await asyncio.to_thread(report_effects, db, started.id,
                                    settings.data_dir / "mail", out)
        return 0 if result.status.value == "completed" else 1

    handle = turns.turn(args.workflow_id)
    if args.cmd == "stream":
        await stream_turn(handle, settings)
        return 0
    if args.cmd == "status":
        out((await handle.status()).model_dump_json(indent=2))
    elif args.cmd == "pending":
        pending = await handle.pending()
        out(json.dumps([p.model_dump() for p in pending], indent=2))
    elif args.cmd in ("approve", "reject"):
        return await review_command(turns, args.workflow_id, args.cmd == "approve",
                                    args.tool_call_id, args.reviewer, args.note)
    return 0


if __name__ == "__main__":
    log_masking.setup(logging.WARNING, Settings.from_env().log_format,
                      text_format=logging.BASIC_FORMAT)
    try:
        code = asyncio.run(main())
    except ClientError as refused:  # e.g. no such turn: one line, not a traceback
        print(f"error: {refused}", file=sys.stderr)
        code = 1
    except TemporalUnreachable as unreachable:
        print(f"error: {unreachable}", file=sys.stderr)
        code = 2
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the Temporal SDK's native runtime was seen to
    # crash there (SIGSEGV, 1 run in ~20 of `starter.py approve`) after the
    # command had done its work, turning a success into exit -11.
    os._exit(code)
