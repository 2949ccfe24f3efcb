"""The offline demo planner: a deterministic stand-in for a model, used when
LLM_BASE_URL is unset. It is NOT a language model. It speaks the provider
interface, emits real tool calls for the sales-assistant scenario, reads the
tool results that come back, and labels every answer it writes.

Plan: query last week's sales above the threshold → if customers matched and
the message names an e-mail address, create follow-up tasks and queue one
e-mail (one response, two calls) → summarise. No match → no e-mail.
"""

from __future__ import annotations

import json
import re
from datetime import date, timedelta
from typing import Any

from turnstile.engine.attributes import RAW_USER_MESSAGE
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.providers.base import ModelRequest, ModelResponse

LABEL = "[offline demo planner]"
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
_AMOUNT = re.compile(r"(\d{1,3}(?:[,_ ]\d{3})+|\d+(?:\.\d+)?)\s*(k|K|thousand)?")


def last_week(today: date) -> tuple[date, date]:
    """Monday..Sunday of the week before the one containing `today`."""
    start = today - timedelta(days=today.weekday() + 7)
    return start, start + timedelta(days=6)


def parse_threshold(text: str, default: float = 50_000.0) -> float:
    candidates = []
    for m in _AMOUNT.finditer(text):
        value = float(re.sub(r"[,_ ]", "", m.group(1)))
        if m.group(2):
            value *= 1000
        candidates.append(value)
    big = [v for v in candidates if v >= 100]
    return max(big) if big else default


def parse_period(text: str, today: date) -> tuple[date, date]:
    m = re.search(r"last\s+(\d+)\s+days", text, re.I)
    if m:
        return today - timedelta(days=int(m.group(1))), today
    if re.search(r"this\s+week", text, re.I):
        return today - timedelta(days=today.weekday()), today
    return last_week(today)


class DemoPlanner:
    name = "offline-demo-planner"
    supports_response_format = False  # it cannot write JSON: typed services get instructions
    model = "turnstile-demo-planner"

    def __init__(self, today: Any = None) -> None:
        self._today = today  # callable returning a date; None = the real clock

    def today(self) -> date:
        return self._today() if self._today else date.today()

    async def aclose(self) -> None:
        return None

    async def complete(self, request: ModelRequest) -> ModelResponse:
        msgs = request.messages
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
        # Plan from the user's own words: retrieved text (step 5) may hold
        # numbers and addresses that are not the request's.
        user = msgs[last_user] if last_user >= 0 else None
        text = ((user.attributes.get(RAW_USER_MESSAGE) or user.content or "")
                if user is not None else "")
        results = self._results_since(msgs[last_user + 1 :])
        available = {t.name for t in request.tools}
        ids = f"call_{len(msgs)}"
        return self._answer_or_call(text, results, available, ids)

    @staticmethod
    def _results_since(msgs: list[ChatMessage]) -> dict[str, tuple[Any, bool]]:
        names = {c.id: c.name for m in msgs for c in m.tool_calls}
        out: dict[str, tuple[Any, bool]] = {}
        for m in msgs:
            if m.role == "tool" and m.tool_call_id in names:
                try:
                    body: Any = json.loads(m.content or "")
                except ValueError:
                    body = m.content
                out[names[m.tool_call_id]] = (body, m.is_error)
        return out

    def _answer_or_call(
        self, text: str, results: dict[str, tuple[Any, bool]], available: set[str], ids: str
    ) -> ModelResponse:
        if "querySalesData" not in available or not re.search(r"sales|customer", text, re.I):
            return _say(
                "I can only run the sales follow-up scenario offline: ask me to find customers "
                "whose sales last week exceeded an amount and to e-mail someone to follow up. "
                "Set LLM_BASE_URL to use a real model."
            )
        if "querySalesData" not in results:
            start, end = parse_period(text, self.today())
            args = {"startDate": start.isoformat(), "endDate": end.isoformat(),
                    "minAmount": parse_threshold(text)}
            return _call(ToolCall(id=f"{ids}_0", name="querySalesData", arguments=json.dumps(args)))
        body, is_error = results["querySalesData"]
        if is_error or not isinstance(body, dict):
            return _say(f"The sales query failed, so nothing was sent. The tool said: {body}")
        records = body.get("salesRecords") or []
        if not records:
            reason = body.get("noDataReason") or "no customer matched"
            return _say(f"No customers matched ({reason}), so no follow-up and no e-mail "
                        "were created.")
        lines = [
            f"- {r.get('customerName')} ({r.get('customerId')}): {r.get('totalAmount')}"
            for r in records
        ]
        total = body.get("totalCount", len(records))
        recipient = _EMAIL.search(text)
        wanted = {"createFollowUpTask", "createEmailTask"} & available
        if recipient and wanted and not (wanted & results.keys()):
            customer_ids = [str(r.get("customerId")) for r in records]
            calls: list[ToolCall] = []
            if "createFollowUpTask" in wanted:
                calls.append(ToolCall(id=f"{ids}_{len(calls)}", name="createFollowUpTask",
                                      arguments=json.dumps({
                                          "customerIds": customer_ids,
                                          "assignee": recipient.group(0),
                                          "note": "Sales above threshold last week: follow up."})))
            if "createEmailTask" in wanted:
                body_text = (f"{total} customer(s) exceeded the threshold:\n" + "\n".join(lines)
                             + "\n\nPlease follow up.\n-- sent by Turnstile " + LABEL)
                calls.append(ToolCall(id=f"{ids}_{len(calls)}", name="createEmailTask",
                                      arguments=json.dumps({
                                          "to": recipient.group(0),
                                          "subject":
                                              f"Follow up: {total} customer(s) over threshold",
                                          "body": body_text})))
            return _call(*calls)
        summary = f"{total} customer(s) matched:\n" + "\n".join(lines)
        for name, (res, err) in results.items():
            if name == "querySalesData":
                continue
            summary += f"\n{name}: {'FAILED - ' if err else ''}{_short(res)}"
        return _say(summary)


def _short(res: Any) -> str:
    if isinstance(res, dict):
        keys = ("taskId", "status", "createdCount", "message", "note")
        picked = {k: res[k] for k in keys if k in res}
        return json.dumps(picked or res)[:300]
    return str(res)[:300]


def _say(text: str) -> ModelResponse:
    return ModelResponse(
        message=ChatMessage(role="assistant", content=f"{LABEL} {text}"),
        finish_reason="stop", model=DemoPlanner.model,
    )


def _call(*calls: ToolCall) -> ModelResponse:
    return ModelResponse(
        message=ChatMessage(role="assistant", content=None, tool_calls=list(calls)),
        finish_reason="tool_calls", model=DemoPlanner.model,
    )
