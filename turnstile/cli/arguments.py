"""The arguments of starter.py's audit and usage commands (kept here so
starter.py stays one function a subcommand)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def add_audit(sub: Sub) -> None:
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


def add_usage(sub: Sub) -> None:
    p_usage = sub.add_parser("usage", help="model tokens per user, service and model: turns, "
                             "model calls, prompt and completion tokens")
    p_usage.add_argument("--since", default=None,
                         help="window start: 1h, 7d, or an ISO time; default all time")
    p_usage.add_argument("--until", default=None, help="window end (ISO time); default now")
    p_usage.add_argument("--user", default=None)
    p_usage.add_argument("--service", default=None)
    p_usage.add_argument("--json", action="store_true", help="JSON lines instead of a table")
