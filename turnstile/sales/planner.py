"""The sales app's script for the offline demo planner
(turnstile.providers.demo_planner): the sales-assistant scenario with real
tool calls.

Plan: query last week's sales above the threshold -> if customers matched and
the message names an e-mail address, create follow-up tasks and queue one
e-mail (one response, two calls) -> summarise. No match -> no e-mail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import date
from typing import Any

from turnstile.engine.date_ranges import date_ranges, last_days
from turnstile.engine.messages import ToolCall
from turnstile.providers.base import ModelResponse
from turnstile.providers.demo_planner import LABEL, DemoPlanner, PlannerTurn, call, say

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
_AMOUNT = re.compile(r"(\d{1,3}(?:[,_ ]\d{3})+|\d+(?:\.\d+)?)\s*(k|K|thousand)?")
QUERY, FOLLOW_UP, EMAIL = "querySalesData", "createFollowUpTask", "createEmailTask"


def parse_threshold(text: str, default: float = 50_000.0) -> float:
    candidates = []
    for m in _AMOUNT.finditer(text):
        value = float(re.sub(r"[,_ ]", "", m.group(1)))
        if m.group(2):
            value *= 1000
        candidates.append(value)
    big = [v for v in candidates if v >= 100]
    return max(big) if big else default


_PERIODS = [(re.compile(r"\byesterday\b", re.I), "yesterday"),
            (re.compile(r"\bthis\s+week\b", re.I), "this_week"),
            (re.compile(r"\bthis\s+month\b", re.I), "this_month"),
            (re.compile(r"\blast\s+month\b", re.I), "last_month")]


def parse_period(text: str, today: date) -> tuple[date, date]:
    """The period the request names, by the definitions the prompt gives a
    real model (turnstile.engine.date_ranges); none named: last week."""
    m = re.search(r"last\s+(\d+)\s+days", text, re.I)
    if m and int(m.group(1)) >= 1:
        return last_days(today, int(m.group(1)))
    ranges = date_ranges(today)
    for pattern, name in _PERIODS:
        if pattern.search(text):
            return ranges[name]
    return ranges["last_week"]


class SalesScript:
    """The sales follow-up scenario; passes on requests without the query
    tool or that do not speak of sales or customers."""

    hint = ("ask me to find customers whose sales last week exceeded an amount and to e-mail "
            "someone to follow up")

    def plan(self, turn: PlannerTurn) -> ModelResponse | None:
        if QUERY not in turn.available or not re.search(r"sales|customer", turn.text, re.I):
            return None
        if QUERY not in turn.results:
            start, end = parse_period(turn.text, turn.today)
            args = {"startDate": start.isoformat(), "endDate": end.isoformat(),
                    "minAmount": parse_threshold(turn.text)}
            return call(ToolCall(id=turn.call_id(0), name=QUERY, arguments=json.dumps(args)))
        body, is_error = turn.results[QUERY]
        if is_error or not isinstance(body, dict):
            return say(f"The sales query failed, so nothing was sent. The tool said: {body}")
        records = body.get("salesRecords") or []
        if not records:
            reason = body.get("noDataReason") or "no customer matched"
            return say(f"No customers matched ({reason}), so no follow-up and no e-mail "
                       "were created.")
        lines = [f"- {r.get('customerName')} ({r.get('customerId')}): {r.get('totalAmount')}"
                 for r in records]
        total = body.get("totalCount", len(records))
        recipient = _EMAIL.search(turn.text)
        wanted = {FOLLOW_UP, EMAIL} & turn.available
        if recipient and wanted and not (wanted & turn.results.keys()):
            return call(*_follow_up_calls(turn, recipient.group(0), records, lines, total,
                                          wanted))
        summary = f"{total} customer(s) matched:\n" + "\n".join(lines)
        for name, (res, err) in turn.results.items():
            if name != QUERY:
                summary += f"\n{name}: {'FAILED - ' if err else ''}{_short(res)}"
        return say(summary)


def _follow_up_calls(turn: PlannerTurn, recipient: str, records: list[dict[str, Any]],
                     lines: list[str], total: object, wanted: set[str]) -> list[ToolCall]:
    calls: list[ToolCall] = []
    if FOLLOW_UP in wanted:
        calls.append(ToolCall(id=turn.call_id(len(calls)), name=FOLLOW_UP, arguments=json.dumps({
            "customerIds": [str(r.get("customerId")) for r in records],
            "assignee": recipient,
            "note": "Sales above threshold last week: follow up."})))
    if EMAIL in wanted:
        body_text = (f"{total} customer(s) exceeded the threshold:\n" + "\n".join(lines)
                     + "\n\nPlease follow up.\n-- sent by Turnstile " + LABEL)
        calls.append(ToolCall(id=turn.call_id(len(calls)), name=EMAIL, arguments=json.dumps({
            "to": recipient,
            "subject": f"Follow up: {total} customer(s) over threshold",
            "body": body_text})))
    return calls


def _short(res: Any) -> str:
    if isinstance(res, dict):
        keys = ("taskId", "status", "createdCount", "message", "note")
        picked = {k: res[k] for k in keys if k in res}
        return json.dumps(picked or res)[:300]
    return str(res)[:300]


def demo_planner(today: Callable[[], date] | None = None) -> DemoPlanner:
    """The offline demo planner with the sales script (tests, demos)."""
    return DemoPlanner([SalesScript()], today=today)
