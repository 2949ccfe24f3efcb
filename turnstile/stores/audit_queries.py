"""Questions to the audit log (`tool_execution_log`), for `starter.py audit`.

- `calls`: the executions matching filters (a time window, tool, user,
  status), newest first;
- `top_callers`: calls per (user, tool) in a window, those above a threshold
  ("who called querySalesData more than 100 times in the last hour");
- `failures_by_category`: failed executions in a window, by error category.

Each reads a range of `start_time` through the indexes of migration 0004:
`tool_execution_log_time (start_time, user_id, tool_name, status)` answers the
window and the per-user counts from the index alone;
`tool_execution_log_status_time (status, start_time)` finds the failures of a
window without reading the successes. bench/audit.py times them on 2,000,000
rows.

`start_time` is ISO-8601 UTC text of one width (`2026-12-01T04:00:00.000+00:00`,
turnstile.stores.memory.now_iso), so a window is a text range.

Error categories come from the audit's `error_message`, whose leading words
the worker writes in fixed forms (activities/tool_calls.py, saga.py): see
`CATEGORIES`; anything else is "tool error" (the tool ran and reported or
raised a failure of its own).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import sqlalchemy as sa

from turnstile.engine.contract import AuditStatus
from turnstile.stores.audit import tool_execution_log
from turnstile.stores.db import Database

log_table = tool_execution_log
c = log_table.c

FAILED_STATUSES = (AuditStatus.FAILED.value, AuditStatus.COMPENSATION_FAILED.value)

# (category, LIKE pattern on error_message), first match wins.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("interrupted", "interrupted;%"),
    ("invalid arguments", "invalid arguments%"),
    ("timeout", "%took too long%"),
    ("database unavailable", "database unavailable%"),
    ("database error", "database error%"),
    ("database error", "the database refused%"),
    ("rejected", "The call to % was rejected%"),
)
COMPENSATION_FAILED = "compensation failed"
OTHER = "tool error"

_DURATION = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`1h`, `30m`, `7d`, `2w`, `90s` before now, or an ISO-8601 time (UTC if
    it names no zone). ValueError says what is accepted."""
    now = now or datetime.now(UTC)
    m = _DURATION.match(text.strip())
    if m:
        return now - timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since {text!r}: use a duration such as 1h, 30m, 7d, or an "
                         "ISO time such as 2026-12-01T09:00:00Z") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def stored_time(moment: datetime) -> str:
    """`moment` in the stored form of start_time (comparable as text)."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


class AuditFilter(NamedTuple):
    """What `starter.py audit` asks about (None: any)."""

    since: datetime | None = None
    until: datetime | None = None
    tool: str | None = None
    user: str | None = None
    status: str | None = None

    def where(self) -> list[sa.ColumnElement[bool]]:
        """The conditions of the fields that are set."""
        equal = [(c.tool_name, self.tool), (c.user_id, self.user),
                 (c.status, self.status.upper() if self.status else None)]
        conditions = [column == value for column, value in equal if value]
        if self.since is not None:
            conditions.append(c.start_time >= stored_time(self.since))
        if self.until is not None:
            conditions.append(c.start_time < stored_time(self.until))
        return conditions


class Execution(NamedTuple):
    """One row of `calls`."""

    start_time: str
    end_time: str | None
    user_id: str
    tool_name: str
    status: str
    workflow_id: str
    execution_id: str
    error_message: str | None
    approval_reason: str | None  # why the call waited for a reviewer (a condition's words)
    grant_id: str | None  # the standing approval that approved it (no reviewer waited)
    provenance: str | None  # JSON, masked: where its sensitive arguments' values came from


class Callers(NamedTuple):
    """One row of `top_callers`."""

    user_id: str
    tool_name: str
    calls: int


class Failures(NamedTuple):
    """One row of `failures_by_category`."""

    category: str
    failures: int
    tools: int
    latest: str


Answer = Execution | Callers | Failures


def calls(db: Database, f: AuditFilter, limit: int = 50) -> list[Execution]:
    """The executions matching `f`, newest first, at most `limit`."""
    stmt = (sa.select(*(c[name] for name in Execution._fields))
            .where(*f.where()).order_by(c.start_time.desc()).limit(limit))
    with db.connect() as conn:
        return conn.rows(stmt, Execution)


def top_callers(db: Database, f: AuditFilter, over: int = 0,
                limit: int = 50) -> list[Callers]:
    """Calls per (user, tool) matching `f`, the pairs with more than `over`,
    most first."""
    n = sa.func.count().label("calls")
    stmt = (sa.select(c.user_id, c.tool_name, n).where(*f.where())
            .group_by(c.user_id, c.tool_name).having(sa.func.count() > over)
            .order_by(n.desc(), c.user_id, c.tool_name).limit(limit))
    with db.connect() as conn:
        return [r._replace(calls=int(r.calls)) for r in conn.rows(stmt, Callers)]


def category_sql() -> sa.ColumnElement[str]:
    whens: list[tuple[sa.ColumnElement[bool], str]] = [
        (c.status == AuditStatus.COMPENSATION_FAILED.value, COMPENSATION_FAILED)]
    whens += [(c.error_message.like(pattern), name) for name, pattern in CATEGORIES]
    return sa.case(*whens, else_=OTHER)


def failures_by_category(db: Database, f: AuditFilter) -> list[Failures]:
    """Failed executions (FAILED, COMPENSATION_FAILED) matching `f`, counted
    by error category, with the tools involved and the latest failure time."""
    if f.status and f.status.upper() not in FAILED_STATUSES:
        return []
    category = category_sql().label("category")
    stmt = (sa.select(category, sa.func.count().label("failures"),
                      sa.func.count(sa.distinct(c.tool_name)).label("tools"),
                      sa.func.max(c.start_time).label("latest"))
            .where(c.status.in_(FAILED_STATUSES), *f.where())
            .group_by(category).order_by(sa.desc("failures"), category))
    with db.connect() as conn:
        return [r._replace(failures=int(r.failures), tools=int(r.tools))
                for r in conn.rows(stmt, Failures)]
