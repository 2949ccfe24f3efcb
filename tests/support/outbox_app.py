"""An app of the tests' own that mails through the public outbox
(`turnstile.Outbox`), written as a builder would: only `turnstile`.

Service `notices`: `sendNotice(to, subject, body)` queues one e-mail (needs
approval; the compensation cancels it if it was not sent yet), and
`closeTicket(ticket)` fails for good when the ticket is "broken" (a fatal
tool: the turn fails and its effects are rolled back). The offline model is
a function: it sends one notice per address in the message, then closes the
ticket the message names (if any), then answers.

`TURNSTILE_APPS=tests.support.outbox_app:build_app` serves it in a worker
process (the kill test); `build_app(outbox=...)` gives a test its own
sender settings.
"""

from __future__ import annotations

import re
import time
from typing import Any

import sqlalchemy as sa

from turnstile import (
    App,
    FunctionModel,
    ModelCall,
    Outbox,
    Reply,
    Service,
    ToolContext,
    ToolExecutionError,
    ToolRegistry,
    Undo,
    call,
    tool,
)
from turnstile.outbox import EmailStatus, EmailTask, SenderConfig

ADDRESS = re.compile(r"[a-z0-9.]+@example\.com")
TICKET = re.compile(r"ticket (\w+)")
TABLE = "notice_mail"


def newest_claimed_again(mail: Outbox, ctx: ToolContext, timeout: float = 20.0) -> None:
    """Wait until the outbox's newest task is SENDING with more attempts than
    when the wait began: a delivery attempt has just claimed it."""
    def newest() -> EmailTask:
        with ctx.db.connect() as conn:
            row = conn.execute(sa.select(mail.table).order_by(
                mail.table.c.created_at.desc()).limit(1)).one()
        return EmailTask.from_row(row)

    first, deadline = newest().attempts, time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = newest()
        if now.status is EmailStatus.SENDING and now.attempts > first:
            return
        time.sleep(0.02)
    raise ToolExecutionError("the newest mail was not claimed again in time", retryable=False)


def build_app(outbox: Outbox | None = None) -> App:
    mail = outbox or Outbox(TABLE)

    @tool(requires_approval=True, transactional=True, idempotent=True,
           review_fields=("to", "subject"))
    def sendNotice(ctx: ToolContext, to: str, subject: str, body: str) -> dict[str, Any]:
        """Queue one e-mail notice (needs approval); the sender delivers it."""
        task, created = mail.enqueue(ctx, to=to, subject=subject, body=body)
        return {"taskId": task.task_id, "status": task.status.value, "created": created}

    @sendNotice.compensation
    def unsend(ctx: ToolContext, arguments: Any, result: Any) -> Undo | str:
        # No task id needed: the call's idempotency key finds its task.
        return mail.cancel(ctx)

    @tool(fatal_on_failure=True)
    def closeTicket(ctx: ToolContext, ticket: str) -> str:
        """Close a ticket."""
        if ticket == "midsend":
            # Fails just after a sender's new attempt claimed the newest mail,
            # so the compensation meets it SENDING.
            newest_claimed_again(mail, ctx)
        if ticket in ("broken", "midsend"):
            raise ToolExecutionError(f"ticket {ticket} cannot be closed", retryable=False)
        return f"ticket {ticket} closed"

    def model(request: ModelCall) -> Reply:
        addresses = ADDRESS.findall(request.user_text)
        done = sum(1 for r in request.results if r.name == "sendNotice")
        if done < len(addresses):
            to = addresses[done]
            return call("sendNotice", to=to, subject=f"Notice {done + 1}",
                        body=f"Hello {to}, this is notice {done + 1}.")
        ticket = TICKET.search(request.user_text)
        if ticket and request.result_of("closeTicket") is None:
            return call("closeTicket", ticket=ticket.group(1))
        return f"sent {done} notice(s)"

    service = Service(name="notices", tools=ToolRegistry([sendNotice, closeTicket]),
                      system_prompt="You send e-mail notices.",
                      description="Send e-mail notices", offline_model=FunctionModel(model))
    return App(name="notices", services=[service], tables=[*mail.tables],
               background=mail.background, dev_services=mail.dev_services)



def build_outage_app() -> App:
    """`build_app` whose sender gives up on an SMTP server after 2 s and
    tries again 0.5 s later (`TURNSTILE_APPS=tests.support.outbox_app:
    build_outage_app`: the kill test's worker and sender processes)."""
    return build_app(Outbox(TABLE, sender=SenderConfig(retry_delays=(0.5,) * 80,
                                                       smtp_timeout_seconds=2)))
