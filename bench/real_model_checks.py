"""What bench/real_model.py checks of one run: the turn's calls, the mail the
SMTP server received, the answer against the query's truth, the model-call
attempts in the turn's history, and the flags for what must not happen.

Two verdicts per run, both strict:

- **did the job**: the turn ended `completed`; querySalesData was called with
  minAmount 50,000 (its dates may be wrong); exactly one mail went out, to
  ops@example.com; the answer names every customer the model's own query
  found (at least one), by name or by id.
- **did it exactly**: did the job, and the query's dates were last week's
  (Monday..Sunday), and the customers the answer names are exactly the ones
  the right query finds, by name: all of them, and no other customer of the
  database (`exactly`).

Beside them, **the mail lists them**: the one mail names exactly those
customers too (`mail_names_exactly`); a small model often writes the mail as
a letter to one customer or as a template."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import date
from decimal import Decimal, InvalidOperation
from email.message import EmailMessage
from typing import Any

import sqlalchemy as sa
from temporalio.api.enums.v1 import EventType

from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import CALL_MODEL
from turnstile.sales.query import run_sales_query
from turnstile.sales.schema import email_task, sales_record
from turnstile.sales.seed import last_week
from turnstile.testing import TestStack

THRESHOLD = Decimal(50_000)
RECIPIENT = "ops@example.com"
# The flags: what must not happen ("Done when").
REFUSED, CRASH, RETRIED, EMPTY, TWICE, HUNG = (
    "refused", "server-crash", "retried-beyond-bound", "completed-empty",
    "mail-sent-twice", "hung")
MORE_MAIL = "more-than-one-mail"  # different mails: not the demo, not a repeat either
# `completed` with an answer that is a tool call written as text (JSON naming
# one of the sales tools) rather than an answer: not an issue-36 rule, but
# not a success either.
CALL_AS_ANSWER = "completed-with-call-as-text"
SALES_TOOLS = ("querySalesData", "createFollowUpTask", "createEmailTask", "checkEmailConfig",
               "getEmailTaskStatus", "retryEmailTask")


@dataclass
class RunRecord:
    server: str
    run: int
    ending: str
    seconds: float
    rounds: int
    calls: list[str]  # "name:status" in order
    query_args_right: bool | None  # None: querySalesData never called
    query_args: dict[str, Any] | None
    mails: int
    mail_to_ops: bool
    customers_named: int
    customers_expected: int
    max_model_attempts: int
    answer: str
    error: str = ""
    flags: list[str] = field(default_factory=list)
    did_job: bool = False
    exact: bool = False
    others_named: int = 0  # customers of the database named in the answer, not the query's
    mail_names_exactly: bool = False  # the mail names the right customers, no other
    replies: list[str] = field(default_factory=list)  # every assistant reply (300 chars each)
    # Every model request of the turn as the server answered it (wall seconds,
    # usage, tokens/s, constrained or not, finish_reason: bench/model_requests.py).
    requests: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        args = {None: "not called", True: "right", False: f"WRONG {self.query_args}"}
        return (f"{self.server} run {self.run}: {self.ending} in {self.seconds:.0f} s, "
                f"{self.rounds} round(s); tools {' > '.join(self.calls) or 'none'}; "
                f"query args {args[self.query_args_right]}; mails {self.mails}"
                f"{' to ' + RECIPIENT if self.mail_to_ops else ''}; answer names "
                f"{self.customers_named}/{self.customers_expected} customers; model attempts "
                f"max {self.max_model_attempts}"
                + (f"; error {self.error[:200]}" if self.error else "")
                + f"; did the job {'yes' if self.did_job else 'no'}, exactly "
                f"{'yes' if self.exact else 'no'}"
                + f"; flags {', '.join(self.flags) or 'none'}\n    answer: "
                + json.dumps(self.answer[:300]))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def amount_right(args: Any) -> bool:
    if not isinstance(args, dict):
        return False
    try:
        amount = Decimal(str(args.get("minAmount")).replace(",", ""))
    except InvalidOperation:
        return False
    return amount == THRESHOLD


def query_args_right(args: Any, today: date) -> bool:
    if not isinstance(args, dict):
        return False
    start, end = last_week(today)
    return (args.get("startDate") == start.isoformat() and args.get("endDate") == end.isoformat()
            and amount_right(args))


def customers_found(stack: TestStack, start: date, end: date,
                    today: date) -> list[tuple[str, str]]:
    """(name, id) of each customer the query finds."""
    with stack.db.connect(readonly=True) as conn:
        found = run_sales_query(conn, start, end, THRESHOLD, today=today)
    return [(r.customerName, r.customerId) for r in found.salesRecords]


def expected_customers(stack: TestStack, today: date) -> list[str]:
    return [name for name, _ in customers_found(stack, *last_week(today), today)]


def own_query_customers(stack: TestStack, args: Any, today: date) -> list[tuple[str, str]]:
    """(name, id) of the customers the model's own querySalesData call found
    ([] when its arguments do not make a query)."""
    if not isinstance(args, dict):
        return []
    try:
        start = date.fromisoformat(str(args.get("startDate")))
        end = date.fromisoformat(str(args.get("endDate")))
        return customers_found(stack, start, end, today)
    except ValueError:  # not dates, or a period the tool refuses
        return []


def all_customers(stack: TestStack) -> set[str]:
    with stack.db.connect(readonly=True) as conn:
        return set(conn.sa.execute(sa.select(sales_record.c.customer_name).distinct()).scalars())


def named_in(text: str, names: Any) -> set[str]:
    low = text.lower()
    return {n for n in names if n.lower() in low}


def replies_of(stack: TestStack, conversation: str, workflow_id: str) -> list[str]:
    """Each assistant reply of the turn: its text, or its calls."""
    out = []
    for m in stack.memory(conversation):
        if m.role != "assistant" or m.attributes.get(attr.WORKFLOW_ID) not in (
                None, workflow_id):
            continue
        calls = "; ".join(f"{c.name}({c.arguments})" for c in m.tool_calls or [])
        out.append(((m.content or "") + (f" [calls {calls}]" if calls else ""))[:300])
    return out


async def mail_settled(stack: TestStack, timeout: float = 30) -> None:
    """Wait until the sender has nothing queued or sending."""
    deadline = time.monotonic() + timeout
    waiting = sa.select(sa.func.count()).select_from(email_task).where(
        email_task.c.status.in_(("QUEUED", "SENDING")))
    while time.monotonic() < deadline:
        with stack.db.connect(readonly=True) as conn:
            if not conn.sa.execute(waiting).scalar_one():
                return
        await asyncio.sleep(0.5)


async def max_model_attempts(stack: TestStack, workflow_id: str) -> int:
    """The highest attempt of any model call in the turn's history."""
    if stack.client is None:
        return 0
    history = await stack.client.temporal.get_workflow_handle(workflow_id).fetch_history()
    model_calls: set[int] = set()
    attempts = [0]
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if e.activity_task_scheduled_event_attributes.activity_type.name == CALL_MODEL:
                model_calls.add(e.event_id)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = e.activity_task_started_event_attributes
            if started.scheduled_event_id in model_calls:
                attempts.append(started.attempt)
    return max(attempts)


def calls_of(stack: TestStack, result: Any, conversation: str) -> list[tuple[str, Any, str]]:
    """(name, arguments, status) of every call the model made, in order."""
    if result is not None:
        return [(c.name, c.arguments, str(c.status)) for c in result.tool_calls]
    out = []
    for m in stack.memory(conversation):
        for c in m.tool_calls or []:
            try:
                args = json.loads(c.arguments)
            except ValueError:
                args = c.arguments
            out.append((c.name, args, "?"))
    return out


async def inspect_run(stack: TestStack, server: str, run: int, result: Any, workflow_id: str,
                      conversation: str, mails_before: int, seconds: float, crash: str | None,
                      today: date, retry_bound: int) -> RunRecord:
    await mail_settled(stack)
    calls = calls_of(stack, result, conversation)
    queries = [args for name, args, _ in calls if name == "querySalesData"]
    mails = stack.mail[mails_before:]
    expected = expected_customers(stack, today)
    answer = "" if result is None or result.answer is None else str(result.answer)
    named = sum(1 for n in expected if n.lower() in answer.lower())
    error = "" if result is None or result.error is None else \
        f"{result.error.type}: {result.error.message}"
    attempts = await max_model_attempts(stack, workflow_id)
    record = RunRecord(
        server=server, run=run, ending=result.status if result is not None else "hung",
        seconds=seconds, rounds=result.round_trips if result is not None else 0,
        calls=[f"{n}:{s}" for n, _, s in calls],
        query_args_right=query_args_right(queries[0], today) if queries else None,
        query_args=queries[0] if queries and isinstance(queries[0], dict) else None,
        mails=len(mails), mail_to_ops=any(RECIPIENT in str(m["To"]) for m in mails),
        customers_named=named, customers_expected=len(expected),
        max_model_attempts=attempts, answer=answer, error=error,
        replies=replies_of(stack, conversation, workflow_id))
    truth = set(expected)
    others = named_in(answer, all_customers(stack) - truth)
    record.others_named = len(others)
    own = own_query_customers(stack, queries[0], today) if queries else []
    one_mail_to_ops = len(mails) == 1 and RECIPIENT in str(mails[0]["To"])
    record.did_job = (record.ending == "completed" and bool(queries)
                      and amount_right(queries[0]) and one_mail_to_ops and bool(own)
                      and all(named_in(answer, pair) for pair in own))
    if one_mail_to_ops:
        body = f"{mails[0]['Subject']}\n{_body(mails[0])}"
        record.mail_names_exactly = (named_in(body, truth) == truth
                                     and not named_in(body, all_customers(stack) - truth))
    record.exact = exactly(record)
    if result is not None and result.error is not None and (
            result.error.type == "ModelServerRefused"
            or result.error.type == "ModelRequestRejected" and "grammar" in result.error.message):
        record.flags.append(REFUSED)
    if crash:
        record.flags.append(CRASH)
    if attempts > retry_bound:
        record.flags.append(RETRIED)
    if record.ending == "completed" and not answer.strip():
        record.flags.append(EMPTY)
    if record.ending == "completed" and any(f'"{t}"' in answer for t in SALES_TOOLS):
        record.flags.append(CALL_AS_ANSWER)
    contents = Counter((str(m["To"]), str(m["Subject"]), _body(m)) for m in mails)
    if any(n > 1 for n in contents.values()):
        record.flags.append(TWICE)
    elif len(mails) > 1:
        record.flags.append(MORE_MAIL)
    if result is None:
        record.flags.append(HUNG)
    return record


def exactly(r: RunRecord) -> bool:
    """Did it exactly (the module's docstring), from a record's fields."""
    return (r.did_job and bool(r.query_args_right) and r.others_named == 0
            and r.customers_named == r.customers_expected > 0)


def _body(mail: EmailMessage) -> str:
    part = mail.get_body(preferencelist=("plain",))
    return "" if part is None else str(part.get_content())


def summary_rows(records: list[RunRecord]) -> list[list[str]]:
    rows = []
    for server in dict.fromkeys(r.server for r in records):
        mine = [r for r in records if r.server == server]
        endings = Counter(r.ending for r in mine)
        flags = Counter(f for r in mine for f in r.flags)
        rows.append([
            server, str(len(mine)),
            f"{sum(1 for r in mine if r.query_args_right)}/{len(mine)}",
            f"{sum(1 for r in mine if r.mail_to_ops)}/{len(mine)}",
            str(sum(r.mails for r in mine)),
            f"{sum(1 for r in mine if r.customers_named == r.customers_expected > 0)}/{len(mine)}",
            f"{sum(1 for r in mine if r.did_job)}/{len(mine)}",
            f"{sum(1 for r in mine if exactly(r))}/{len(mine)}",
            f"{sum(1 for r in mine if r.mail_names_exactly)}/{len(mine)}",
            ", ".join(f"{k} {v}" for k, v in endings.most_common()),
            ", ".join(f"{k} {v}" for k, v in flags.most_common()) or "none",
        ])
    return rows
