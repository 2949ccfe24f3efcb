"""`starter.py audit` and `starter.py usage`: the audit log and model usage
read back as tables or JSON lines (turnstile.cli.printing prints them)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from turnstile.cli.printing import audit_notes, audit_provenance, json_lines, out, table
from turnstile.engine.contract import AuditStatus
from turnstile.engine.flow import refusal_reason
from turnstile.stores.db import Database
from turnstile.stores.engines import dispose_engines

__all__ = ["HasDatabase", "audit", "usage"]


class HasDatabase(Protocol):
    """What these commands need of starter.py's Context."""

    def db(self) -> Database: ...


async def audit(args: argparse.Namespace, ctx: HasDatabase) -> int:
    """The audit log's rows or a summary, as a table or JSON lines. A row
    of the calls with provenance (a tool with sensitive arguments) is
    followed by where each argument's values came from, and a FLOW_REFUSED
    row by why (`audit_notes`); in JSON, `provenance` is an object and
    `refusal_reason` the why."""
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
    db = ctx.db()
    answers: Sequence[q.Answer]
    calls = not (args.top or args.failures)
    try:
        if args.top:
            answers = await asyncio.to_thread(q.top_callers, db, f, over=args.over,
                                           limit=args.limit)
            columns = ["user_id", "tool_name", "calls"]
        elif args.failures:
            answers = await asyncio.to_thread(q.failures_by_category, db, f)
            columns = ["category", "failures", "tools", "latest"]
        else:
            answers = await asyncio.to_thread(q.calls, db, f, limit=args.limit)
            columns = ["start_time", "user_id", "tool_name", "status", "workflow_id",
                       "error_message", "grant_id", "approval_reason"]
    finally:
        dispose_engines()
    rows = [a._asdict() for a in answers]
    if args.json:
        lines = json_lines([_readable(r) for r in rows] if calls else rows)
    else:
        window = f"since {q.stored_time(f.since)}" if f.since else "all time"
        lines = [f"{len(rows)} row(s), {window}"]
        if rows:
            header, *cells = table(rows, columns)
            lines.append(header)
            for row, line in zip(rows, cells, strict=True):
                lines += [line, *(audit_notes(row) if calls else [])]
    for line in lines:
        out(line)
    return 0


def _readable(row: dict[str, Any]) -> dict[str, Any]:
    """A row of the calls as JSON: its provenance an object (not JSON text),
    a FLOW_REFUSED row's reason as `refusal_reason`."""
    shown = {**row, "provenance": audit_provenance(row.get("provenance"))}
    if row.get("status") == AuditStatus.FLOW_REFUSED.value:
        text = str(row.get("error_message") or "")
        shown["refusal_reason"] = refusal_reason(text) or text
    return shown


async def usage(args: argparse.Namespace, ctx: HasDatabase) -> int:
    """Model tokens per (user, service, model): a table with a total line, or
    JSON lines."""
    from turnstile.stores import audit_queries as q, usage as u

    try:
        f = u.UsageFilter(
            since=q.parse_since(args.since) if args.since else None,
            until=q.parse_since(args.until) if args.until else None,
            user=args.user, service=args.service)
    except ValueError as exc:
        sys.stderr.write(f"starter.py usage: {exc}\n")
        return 2
    try:
        rows = [r._asdict() for r in await asyncio.to_thread(u.summary, ctx.db(), f)]
    finally:
        dispose_engines()
    if args.json:
        lines = json_lines(rows)
    else:
        window = f"since {u.stored_time(f.since)}" if f.since else "all time"
        if f.until:
            window += f", until {u.stored_time(f.until)}"
        numeric = frozenset({"turns", "model_calls", "prompt_tokens", "completion_tokens"})
        lines = [f"{len(rows)} row(s), {window}",
                 *(table(rows, u.SUMMARY_COLUMNS, numeric=numeric, width=40, total=True)
                   if rows else [])]
    for line in lines:
        out(line)
    return 0
