"""`starter.py audit` and `starter.py usage`: the audit log and model usage
read back as tables or JSON lines (turnstile.cli.printing prints them)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Protocol

from turnstile.cli.printing import json_lines, out, table
from turnstile.stores.db import Database
from turnstile.stores.engines import dispose_engines

__all__ = ["HasDatabase", "audit", "usage"]


class HasDatabase(Protocol):
    """What these commands need of starter.py's Context."""

    def db(self) -> Database: ...


async def audit(args: argparse.Namespace, ctx: HasDatabase) -> int:
    """The audit log's rows or a summary, as a table or JSON lines."""
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
        lines = json_lines(rows)
    else:
        window = f"since {q.stored_time(f.since)}" if f.since else "all time"
        lines = [f"{len(rows)} row(s), {window}", *(table(rows, columns) if rows else [])]
    for line in lines:
        out(line)
    return 0


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
