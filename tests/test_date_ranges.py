"""The dates the model is given instead of working them out (
turnstile.engine.date_ranges): a property over any day of four centuries, and
real turns of `sales-assistant` and `sales-compact` (dev server, worker, the
strict fake model server) whose requests carry today's date and the named
ranges, built by the workflow from its own clock."""

from __future__ import annotations

import calendar
import json
import os
import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from temporalio.client import Client

from tests.support.turns import running_worker
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.engine.date_ranges import date_ranges, date_variables, last_days
from turnstile.sales.planner import parse_period
from turnstile.sales.seed import BIG_CUSTOMERS, last_week, seed
from turnstile.sales.service import (
    COMPACT_SERVICE_NAME,
    SERVICE_NAME,
    build_compact_sales_service,
    build_sales_service,
)
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

EXAMPLES = int(os.environ.get("DATE_RANGE_EXAMPLES", "300"))
DAYS = st.dates(min_value=date(1901, 1, 1), max_value=date(2299, 12, 31))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
@given(today=DAYS, n=st.integers(min_value=1, max_value=400))
def test_ranges_are_well_formed_and_mean_what_the_prompt_says(today: date, n: int) -> None:
    ranges = date_ranges(today)
    for name, (start, end) in ranges.items():
        assert start <= end <= today, name
    y = today - timedelta(days=1)
    assert ranges["yesterday"] == (y, y)
    # Last week: the ISO week before today's, Monday to Sunday, 7 days, never today's.
    start, end = ranges["last_week"]
    assert (start.weekday(), end.weekday(), (end - start).days) == (0, 6, 6)
    assert start.isocalendar()[:2] == (today - timedelta(days=7)).isocalendar()[:2]
    assert ranges["last_week"] == last_week(today)  # the seed's own definition
    this_start, this_end = ranges["this_week"]
    assert this_start == end + timedelta(days=1) and this_end == today
    assert this_start.isocalendar()[:2] == today.isocalendar()[:2]
    # Months: whole calendar months, leap years by the calendar's own rule.
    m_start, m_end = ranges["last_month"]
    assert m_start.day == 1 and m_start.year == m_end.year and m_start.month == m_end.month
    assert m_end.day == calendar.monthrange(m_end.year, m_end.month)[1]
    assert m_end + timedelta(days=1) == ranges["this_month"][0] == today.replace(day=1)
    if (m_end.month, calendar.isleap(m_end.year)) == (2, True):
        assert m_end.day == 29
    # Last N days: N days, today the last of them.
    s, e = last_days(today, n)
    assert ((e - s).days + 1, e) == (n, today)
    assert ranges["last_7_days"] == last_days(today, 7)
    # The offline planner queries what the prompt tells a real model.
    assert parse_period(f"sales in the last {n} days", today) == (s, e)
    for words, name in (("last week", "last_week"), ("this week", "this_week"),
                        ("yesterday", "yesterday"), ("last month", "last_month"),
                        ("this month", "this_month")):
        assert parse_period(f"customers whose sales {words} exceeded 5k", today) == ranges[name]


@pytest.mark.parametrize(("today", "last_month"), [
    (date(2024, 3, 1), ("2024-02-01", "2024-02-29")),  # leap year
    (date(2023, 3, 31), ("2023-02-01", "2023-02-28")),
    (date(2026, 1, 5), ("2025-12-01", "2025-12-31")),  # across the year
])
def test_month_boundaries(today: date, last_month: tuple[str, str]) -> None:
    v = date_variables(today)
    assert (v["last_month_start"], v["last_month_end"]) == last_month
    assert v["last_month"] == f"{last_month[0]} to {last_month[1]}"
    assert f"- last month: {last_month[0]} to {last_month[1]}" in v["date_ranges"].splitlines()


def test_a_sunday_new_year() -> None:
    # 2023-01-01 is a Sunday: this week began on Monday 2022-12-26.
    v = date_variables(date(2023, 1, 1))
    assert v["this_week"] == "2022-12-26 to 2023-01-01"
    assert v["last_week"] == "2022-12-19 to 2022-12-25"
    assert v["yesterday"] == "2022-12-31" and v["this_month"] == "2023-01-01"
    with pytest.raises(ValueError):
        last_days(date(2023, 1, 1), 0)


_LAST_WEEK = re.compile(r"last week: (\d{4}-\d\d-\d\d) to (\d{4}-\d\d-\d\d)")


def copy_last_week(request: dict[str, Any]) -> dict[str, Any]:
    """A model that copies the dates it is given (what a small model can do)."""
    system = request["messages"][0]["content"]
    start, end = _LAST_WEEK.search(system).groups()  # type: ignore[union-attr]
    return tool_reply(("q1", "querySalesData",
                       {"startDate": start, "endDate": end, "minAmount": 50000}))


def expected_lines(today: date) -> list[str]:
    """Written out here, apart from the module: what the prompt must say."""
    monday = today - timedelta(days=today.weekday())
    first = today.replace(day=1)
    prev_end = first - timedelta(days=1)
    return [f"Today is {today.strftime('%A')}, {today.isoformat()}",
            f"- yesterday: {today - timedelta(days=1)}",
            f"- this week: {monday} to {today}",
            f"- last week: {monday - timedelta(days=7)} to {monday - timedelta(days=1)}",
            f"- this month: {first} to {today}" if first != today else f"- this month: {today}",
            f"- last month: {prev_end.replace(day=1)} to {prev_end}",
            f"- last 7 days: {today - timedelta(days=6)} to {today}",
            f"- last 30 days: {today - timedelta(days=29)} to {today}"]


@pytest.mark.parametrize(("service", "build"), [(SERVICE_NAME, build_sales_service),
                                                (COMPACT_SERVICE_NAME,
                                                 build_compact_sales_service)])
async def test_the_request_carries_today_and_the_named_ranges(
        client: Client, task_queue: str, tmp_path: Path, fake_llm: FakeOpenAIServer,
        service: str, build: Any) -> None:
    before = datetime.now(UTC).date()
    fake_llm.script(copy_last_week, text_reply("Found them."))
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", [build()],
                              llm_url=fake_llm.url) as turns:
        seed(turns.rt.db, rows=2000, today=before)
        handle = await turns.start("Which customers' sales last week exceeded 50,000?",
                                   service=service, conversation=f"c-{service}")
        result = await handle.result()
    after = datetime.now(UTC).date()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert fake_llm.refusals == []
    system = fake_llm.requests[0]["messages"][0]
    assert system["role"] == "system"
    said = next(d for d in {before, after} if f"Today is {d.strftime('%A')}, {d}" in
                system["content"])
    for line in expected_lines(said):
        assert line in system["content"], (line, system["content"])
    [query] = result.tool_calls
    start, end = last_week(said)
    assert (query.name, query.status) == ("querySalesData", CallStatus.COMPLETED)
    assert query.arguments == {"startDate": start.isoformat(), "endDate": end.isoformat(),
                               "minAmount": 50000}
    # Copied dates find the week the seed made: its big customers, exactly.
    tool_result = json.loads(fake_llm.requests[1]["messages"][-1]["content"])
    assert tool_result["totalCount"] == BIG_CUSTOMERS, tool_result
