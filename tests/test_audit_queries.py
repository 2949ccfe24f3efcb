"""`starter.py audit`: filters, the per-user/tool summary with a threshold,
failures by error category; on SQLite and PostgreSQL, through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from turnstile.stores import audit_queries as q
from turnstile.stores.db import Database

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime.now(UTC)


def at(minutes_ago: float) -> str:
    return q.stored_time(NOW - timedelta(minutes=minutes_ago))


def row(i: int, user: str, tool: str, minutes_ago: float, status: str = "COMPLETED",
        error: str | None = None) -> dict[str, Any]:
    return {"execution_id": f"wf-{i}/call", "workflow_id": f"wf-{i}", "conversation_id": "c",
            "user_id": user, "tool_name": tool, "input_params": "{}",
            "start_time": at(minutes_ago), "end_time": at(minutes_ago), "status": status,
            "error_message": error}


ERRORS = [
    ("FAILED", "the query took too long (over 3 s) and was stopped; tried 3 time(s)", "timeout"),
    ("FAILED", "database unavailable; tried 3 time(s)", "database unavailable"),
    ("FAILED", "database error (ProgrammingError); tried 1 time(s)", "database error"),
    ("FAILED", "invalid arguments for querySalesData: startDate: ...", "invalid arguments"),
    ("FAILED", "interrupted; effect unknown: worker lost", "interrupted"),
    ("FAILED", "The call to createEmailTask was rejected by bob: no", "rejected"),
    ("FAILED", "SMTP refused: 550", "tool error"),
    ("COMPENSATION_FAILED", "could not cancel", "compensation failed"),
]


@pytest.fixture
def audited(db: Database) -> Database:
    rows = [row(i, "alice", "querySalesData", 30 + i * 0.01) for i in range(120)]  # last hour
    rows += [row(200 + i, "bob", "querySalesData", 20) for i in range(40)]
    rows += [row(300 + i, "alice", "createEmailTask", 10) for i in range(101)]
    rows += [row(2000 + i, "mallory", "querySalesData", 180) for i in range(500)]  # 3 h ago
    rows += [row(900 + i, "carol", "createFollowUpTask", 5, status, error)
             for i, (status, error, _) in enumerate(ERRORS)]
    rows += [row(950, "carol", "querySalesData", 600, "FAILED", "database unavailable")]  # old
    with db.connect() as conn:
        conn.executemany(q.log_table.insert(), rows)
    return db


def test_top_callers_over_a_threshold_in_a_window(audited: Database) -> None:
    hour = q.AuditFilter(since=NOW - timedelta(hours=1))
    top = q.top_callers(audited, hour, over=100)
    assert [(r.user_id, r.tool_name, r.calls) for r in top] == [
        ("alice", "querySalesData", 120), ("alice", "createEmailTask", 101)]
    one_tool = q.top_callers(audited, q.AuditFilter(since=NOW - timedelta(hours=1),
                                                    tool="querySalesData"), over=30)
    assert [(r.user_id, r.calls) for r in one_tool] == [("alice", 120), ("bob", 40)]
    four_hours = q.top_callers(audited, q.AuditFilter(since=NOW - timedelta(hours=4)), over=130)
    assert [(r.user_id, r.calls) for r in four_hours] == [("mallory", 500)]


def test_failures_by_category(audited: Database) -> None:
    hour = q.AuditFilter(since=NOW - timedelta(hours=1))
    found = {r.category: r.failures for r in q.failures_by_category(audited, hour)}
    assert found == {category: 1 for _, _, category in ERRORS}
    day = q.failures_by_category(audited, q.AuditFilter(since=NOW - timedelta(days=1)))
    assert {r.category: r.failures for r in day}["database unavailable"] == 2
    assert q.failures_by_category(audited, q.AuditFilter(status="COMPLETED")) == []


def test_filters_compose(audited: Database) -> None:
    hour = NOW - timedelta(hours=1)
    assert len(q.calls(audited, q.AuditFilter(since=hour, user="bob"), limit=1000)) == 40
    failed = q.calls(audited, q.AuditFilter(status="failed", user="carol"), limit=1000)
    assert len(failed) == 8 and {r.status for r in failed} == {"FAILED"}
    newest = q.calls(audited, q.AuditFilter(tool="createFollowUpTask"), limit=3)
    assert [r.start_time for r in newest] == sorted((r.start_time for r in newest),
                                                       reverse=True)
    assert len(q.calls(audited, q.AuditFilter(since=hour, tool="querySalesData",
                                              user="mallory"))) == 0


def test_parse_since() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert q.parse_since("1h", now) == datetime(2026, 12, 1, 11, 0, tzinfo=UTC)
    assert q.parse_since("7d", now) == datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    assert q.parse_since("2026-11-30T08:00:00") == datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match="duration such as 1h"):
        q.parse_since("yesterday")


def starter(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": db.url}
    return subprocess.run([sys.executable, str(ROOT / "starter.py"), "audit", *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_cli_answers_the_questions(audited: Database) -> None:
    top = starter(audited, "--top", "--over", "100", "--since", "1h")
    assert top.returncode == 0, top.stderr
    lines = top.stdout.splitlines()
    assert lines[0].startswith("2 row(s), since ")
    assert lines[1].split() == ["user_id", "tool_name", "calls"]
    assert [line.split() for line in lines[2:]] == [["alice", "querySalesData", "120"],
                                                   ["alice", "createEmailTask", "101"]]
    failures = starter(audited, "--failures", "--json")  # window: the last hour
    assert failures.returncode == 0, failures.stderr
    got = {json.loads(line)["category"] for line in failures.stdout.splitlines()}
    assert got == {category for _, _, category in ERRORS}
    listed = starter(audited, "--user", "carol", "--status", "FAILED", "--tool",
                     "createFollowUpTask", "--since", "2h", "--json")
    assert len(listed.stdout.splitlines()) == 7, listed.stderr
    bad = starter(audited, "--since", "last tuesday")
    assert bad.returncode == 2 and "duration such as 1h" in bad.stderr
