"""The six tools of the `sales-assistant` service (docs/contract.md, "Reference tools").

Names and parameters are camelCase because they are what the model sees.
Argument types carry the first validation level (see turnstile.sales.query).

The tools that write and the two compensations write on the call journal's
connection (`tool_transaction`): the effect commits with the call's ledger,
audit and memory record or not at all, so an attempt lost before the commit
left nothing and is run again (`transactional=True`, retryEmailTask too).
Writes are keyed by `ctx.idempotency_key` as well (the create tools are
idempotent: the same call run twice changes nothing the second time).

The reads (querySalesData, checkEmailConfig, getEmailTaskStatus) are
`repeatable`: the repeat breaker lets the model ask them again with the same
arguments; a write called again with the same arguments is not run
(turnstile.engine.repeats), "the same" by meaning: addresses compare without
case, customer ids as a set, every text NFC and trimmed
(turnstile.engine.equivalence markers on the argument types below).
getEmailTaskStatus and retryEmailTask take only a task this conversation's
own createEmailTask made (`_own_task`): any other id is "no e-mail task".
Every result says what was done and names a next
step only in terms of the tools the call's service offers (`ctx.offers`):
a service without getEmailTaskStatus is never told to check delivery with it.
"""

from __future__ import annotations

import json
import re
import socket
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import sqlalchemy as sa
from pydantic import AfterValidator, BaseModel, Field
from sqlalchemy.dialects import postgresql, sqlite

from turnstile import (
    AS_SET,
    EMAIL_ADDRESS,
    Connection,
    Settings,
    ToolContext,
    ToolExecutionError,
    Undo,
    tool,
)
from turnstile.sales import outbox, result_texts as texts
from turnstile.sales.access import tool_connection, tool_transaction
from turnstile.sales.outbox import EmailStatus, EmailTask
from turnstile.sales.query import IsoDate, Money, SalesQueryResult, run_sales_query
from turnstile.sales.schema import (
    EMAIL_OUTBOX,
    FOLLOWUP_ROLE,
    follow_up_task,
    now_text,
    sales_daily_total,
)

# No "%" (or "!") in the local part: relaying syntax the allow-list would misread.
_EMAIL = re.compile(r"[A-Za-z0-9._+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_CUSTOMER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TASK_ID = re.compile(r"mail-[0-9a-f]{32}")


def _matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r:.80} is not {what}")
        return value

    return AfterValidator(check)


# Unicode line separators break header lines in some mail software just like
# CR/LF: NEL (U+0085), LINE SEPARATOR (U+2028), PARAGRAPH SEPARATOR (U+2029).
_LINE_BREAKS = frozenset("\u0085\u2028\u2029")


def _one_line(value: str) -> str:
    # Line breaks in a header are header injection; other control characters
    # (NUL above all: PostgreSQL text cannot hold it) are never meant.
    if any(ord(ch) < 32 or ord(ch) == 127 or ch in _LINE_BREAKS for ch in value):
        raise ValueError("must be a single line of text (no line breaks or control characters)")
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\x00) characters")
    return value


EmailAddress = Annotated[
    str,
    # 100: email_task.recipient's CHECK (migration 0004) refuses longer ones.
    Field(max_length=100, json_schema_extra={"format": "email"}),
    _matching(_EMAIL, "one e-mail address such as ops@example.com"),
    EMAIL_ADDRESS,  # the repeat breaker: OPS@Example.com is ops@example.com
]
CustomerId = Annotated[
    str,
    Field(max_length=64, description="a customerId returned by querySalesData, e.g. C0007"),
    _matching(_CUSTOMER_ID, "a customer id (letters, digits, '-' or '_'), e.g. C0007"),
]
TaskId = Annotated[
    str,
    Field(max_length=37, description="the taskId returned by createEmailTask"),
    _matching(_TASK_ID, "an e-mail task id such as mail-0123456789abcdef0123456789abcdef"),
]
OneLine = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_one_line)]
Note = Annotated[str, Field(min_length=1, max_length=2000), AfterValidator(_no_nul)]
Body = Annotated[str, Field(min_length=1, max_length=20_000), AfterValidator(_no_nul)]


def _settings(ctx: ToolContext) -> Settings:
    return ctx.settings if isinstance(ctx.settings, Settings) else Settings.from_env()


def _field(value: Any, name: str) -> Any:
    """A field of a stored tool result or argument set, whatever shape the
    runtime hands back (model, dict, JSON text)."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    elif isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value.get(name) if isinstance(value, dict) else None


# --- querySalesData ---------------------------------------------------------


@tool(idempotent=True, repeatable=True, timeout_seconds=30.0)
def querySalesData(
    ctx: ToolContext,
    startDate: Annotated[IsoDate, Field(description="first day, inclusive, YYYY-MM-DD")],
    endDate: Annotated[IsoDate, Field(description="last day, inclusive, YYYY-MM-DD")],
    minAmount: Annotated[Money, Field(description="a customer's total must exceed this")],
) -> SalesQueryResult:
    """Customers whose total sales in [startDate, endDate] exceeded minAmount,
    largest first, with formatted totals. At most 366 days per query. When more
    than 100 customers match, only the top 10 are listed and totalCount says how
    many matched. An empty result carries noDataReason."""
    with ctx.db.connect(readonly=True) as conn:
        return run_sales_query(conn, startDate, endDate, minAmount, today=datetime.now(UTC).date(),
                               timeout_seconds=ctx.statement_timeout_seconds)


# --- createFollowUpTask ------------------------------------------------------


class FollowUpTask(BaseModel):
    id: int
    customerId: str
    status: str


class FollowUpResult(BaseModel):
    createdByCall: str
    assignee: str
    createdCount: int
    followUpTasks: list[FollowUpTask]
    note: str = ""


# Information flow (docs/information-flow.md): the customer ids come from the
# sales data by design and are checked against it (only known customers); the
# note stays inside the company; an assignee the user never named, taken from
# a tool's result, is shown to a person first.
@tool(idempotent=True, transactional=True,
      sensitive={"customerIds": "allow", "assignee": "review", "note": "allow"})
def createFollowUpTask(
    ctx: ToolContext,
    customerIds: Annotated[list[CustomerId], Field(min_length=1, max_length=100), AS_SET],
    assignee: OneLine,
    note: Note,
) -> FollowUpResult:
    """Create one OPEN follow-up task per customer, assigned to `assignee`.
    Use customerId values from querySalesData."""
    ids = list(dict.fromkeys(customerIds))  # a repeated id is one task
    timeout = ctx.statement_timeout_seconds
    with tool_connection(ctx.db, None, readonly=True, timeout_seconds=timeout) as conn:
        # The per-day rollup has a row for every customer with a sale, keyed by
        # (day, customer): a few thousand rows, not every order.
        daily = sales_daily_total.c
        known = {str(c) for c in conn.execute(
            sa.select(daily.customer_id).distinct().where(daily.customer_id.in_(ids))).scalars()}
    unknown = [c for c in ids if c not in known]
    if unknown:
        raise texts.unknown_customers(ctx, unknown)
    key = ctx.idempotency_key
    now = now_text()
    f = follow_up_task.c
    with tool_transaction(ctx, FOLLOWUP_ROLE) as conn:
        conn.executemany(
            _insert_new_follow_ups(conn.dialect),
            [{"customer_id": c, "assignee": assignee, "note": note, "status": "OPEN",
              "created_by_call": key, "created_at": now} for c in ids],
        )
        rows = conn.sa.execute(sa.select(f.id, f.customer_id, f.status)
                               .where(f.created_by_call == key).order_by(f.id)).all()
    tasks = [FollowUpTask(id=int(task_id), customerId=str(customer), status=str(status))
             for task_id, customer, status in rows]
    return FollowUpResult(
        createdByCall=key, assignee=assignee, createdCount=len(tasks), followUpTasks=tasks,
        note=texts.follow_up_note(ctx, len(tasks), assignee))


def _insert_new_follow_ups(dialect: str) -> sa.Insert:
    """INSERT of follow-up rows that skips the ones this call already made."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert(follow_up_task).on_conflict_do_nothing(
        index_elements=["created_by_call", "customer_id"])


@createFollowUpTask.compensation
def cancel_follow_up_tasks(ctx: ToolContext, arguments: Any, result: Any) -> str:
    key = _field(result, "createdByCall") or ctx.idempotency_key
    f = follow_up_task.c
    with tool_transaction(ctx, FOLLOWUP_ROLE) as conn:
        cur = conn.execute(sa.update(follow_up_task)
                           .where(f.created_by_call == key, f.status != "CANCELLED")
                           .values(status="CANCELLED"))
        total = conn.execute(sa.select(sa.func.count()).select_from(follow_up_task)
                             .where(f.created_by_call == key)).scalar_one()
    return (
        f"cancelled {cur.rowcount} follow-up task(s) created by call {key} "
        f"({int(total)} in total, all CANCELLED now)"
    )


# --- e-mail --------------------------------------------------------------------


class EmailConfigReport(BaseModel):
    smtpHost: str
    smtpPort: int
    reachable: bool
    detail: str
    note: str


@tool(idempotent=True, repeatable=True, timeout_seconds=15.0)
def checkEmailConfig(ctx: ToolContext) -> EmailConfigReport:
    """Which SMTP server the e-mail sender delivers to, and whether it accepts
    TCP connections right now. Sends nothing."""
    settings = _settings(ctx)
    started = time.monotonic()
    try:
        with socket.create_connection((settings.smtp_host, settings.smtp_port), timeout=3):
            pass
        reachable, detail = True, f"connected in {(time.monotonic() - started) * 1000:.0f} ms"
    except OSError as exc:
        reachable, detail = False, f"cannot connect: {exc}"
    return EmailConfigReport(
        smtpHost=settings.smtp_host, smtpPort=settings.smtp_port, reachable=reachable,
        detail=detail, note=texts.config_note(ctx))


class EmailTaskView(BaseModel):
    taskId: str
    status: EmailStatus
    recipient: str
    subject: str
    attempts: int
    maxAttempts: int
    lastError: str | None
    possiblySent: bool
    createdAt: str
    updatedAt: str
    sentAt: str | None
    nextAttemptAt: str | None
    messageId: str
    explanation: str

    @classmethod
    def of(cls, task: EmailTask) -> EmailTaskView:
        return cls(
            taskId=task.task_id, status=task.status, recipient=task.recipient,
            subject=task.subject, attempts=task.attempts,
            maxAttempts=EMAIL_OUTBOX.max_attempts, lastError=task.last_error,
            possiblySent=task.possibly_sent, createdAt=task.created_at,
            updatedAt=task.updated_at, sentAt=task.sent_at, nextAttemptAt=task.next_attempt_at,
            messageId=task.message_id, explanation=texts.explain(task),
        )


class EmailTaskCreated(BaseModel):
    taskId: str
    status: EmailStatus
    recipient: str
    subject: str
    note: str


# Every e-mail waits for a reviewer; the reviewer sees where the recipient,
# subject and body came from (a recipient first seen in a tool's result, such
# as a customer's address from the sales data, is marked untrusted).
@tool(requires_approval=True, fatal_on_failure=True, idempotent=True, transactional=True,
      review_fields=("to", "subject"), recipient_fields=("to",),
      sensitive={"to": "review", "subject": "review", "body": "review"})
def createEmailTask(
    ctx: ToolContext,
    to: EmailAddress,
    subject: OneLine,
    body: Body,
) -> EmailTaskCreated:
    """Queue one e-mail for delivery (needs approval). Returns a taskId with
    status QUEUED: nothing is sent yet; the sender delivers it shortly."""
    task, created = EMAIL_OUTBOX.enqueue(ctx, to=to, subject=subject, body=body)
    note = (texts.queued_note(ctx) if created
            else f"this call already queued this task; current status {task.status.value}")
    return EmailTaskCreated(
        taskId=task.task_id, status=task.status, recipient=task.recipient,
        subject=task.subject, note=note,
    )


@createEmailTask.compensation
def cancel_email_task(ctx: ToolContext, arguments: Any, result: Any) -> Undo | str:
    """The public outbox's compensation: cancelled if not handed to SMTP yet
    (no recorded result: the task this call's key queued, if any)."""
    return EMAIL_OUTBOX.cancel(ctx, _field(result, "taskId") or None)


def _task(ctx: ToolContext, task_id: str) -> EmailTask:
    with tool_connection(ctx.db, None, timeout_seconds=ctx.statement_timeout_seconds) as conn:
        return _own_task(ctx, conn, task_id)


def _own_task(ctx: ToolContext, conn: Connection, task_id: str) -> EmailTask:
    """Refuse a task id that no createEmailTask call of this conversation made
    (the task's key is the creating call's idempotency key, and that call's
    result is in the conversation's memory): one conversation never reads or
    re-sends another's mail (ToolContext.made_here: a tool called directly,
    outside a turn, may name any task)."""
    task = outbox.get_in(conn, task_id)
    if task is None or not ctx.made_here(task.idempotency_key, conn):
        raise texts.no_task(ctx, task_id)
    return task


@tool(idempotent=True, repeatable=True)
def getEmailTaskStatus(ctx: ToolContext, taskId: TaskId) -> EmailTaskView:
    """Delivery status of an e-mail task: QUEUED, SENDING, SENT, FAILED (retried
    automatically), DEAD (gave up) or CANCELLED."""
    return EmailTaskView.of(_task(ctx, taskId))


@tool(transactional=True)
def retryEmailTask(ctx: ToolContext, taskId: TaskId) -> EmailTaskView:
    """Re-queue a FAILED e-mail task for immediate delivery. Only FAILED tasks
    can be retried."""
    with tool_transaction(ctx, None) as conn:
        _own_task(ctx, conn, taskId)
        requeued, task = outbox.requeue_in(conn, taskId)
    if requeued and task is not None:
        return EmailTaskView.of(task)
    if task is None:
        raise texts.no_task(ctx, taskId)
    if task.status is EmailStatus.FAILED and task.possibly_sent:
        reason = (
            "its last delivery was interrupted and it may already have arrived; re-sending "
            "could deliver it twice, so a person must check the recipient's mailbox first"
        )
    else:
        reason = (
            f"only FAILED tasks can be retried, and this one is {task.status.value} "
            f"({texts.explain(task)})"
        )
    raise ToolExecutionError(f"cannot retry e-mail task {taskId}: {reason}", retryable=False)
