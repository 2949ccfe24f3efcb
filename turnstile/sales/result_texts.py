"""What the sales tools tell the model besides their data: the outcome, and
the next step in terms of the tools the call's service offers
(`ToolContext.offers`). A result never names a tool the service does not
offer: "check delivery with getEmailTaskStatus" in a service without it made
a small model queue the same e-mail again and again;
tests/test_result_wording.py checks every text against every service.
"""

from __future__ import annotations

from turnstile import ToolArgumentError, ToolContext
from turnstile.sales.outbox import EmailStatus, EmailTask


def queued_note(ctx: ToolContext) -> str:
    """createEmailTask queued a new e-mail."""
    note = ("Done: the e-mail is queued; nothing has been sent yet, the sender delivers it "
            "shortly. Do not queue it again: tell the user the taskId and that it is QUEUED.")
    if ctx.offers("getEmailTaskStatus"):
        note += " Only if the user asks whether it was sent, check with getEmailTaskStatus."
    return note


def follow_up_note(ctx: ToolContext, count: int, assignee: str) -> str:
    """createFollowUpTask created its tasks."""
    done = (f"Done: {count} OPEN follow-up task(s) assigned to {assignee}. Do not create "
            "them again.")
    if ctx.offers("createEmailTask"):
        return done + " If the user asked for an e-mail about them, send it with createEmailTask."
    return done + " Tell the user what was created."


def config_note(ctx: ToolContext) -> str:
    """checkEmailConfig: who delivers e-mail."""
    if ctx.offers("createEmailTask"):
        return "createEmailTask only queues a message; the sender process delivers it"
    return "queued e-mail is delivered by the sender process"


def unknown_customers(ctx: ToolContext, unknown: list[str]) -> ToolArgumentError:
    where = ("that querySalesData returned" if ctx.offers("querySalesData")
             else "of customers with sales")
    return ToolArgumentError(
        f"unknown customerIds: {', '.join(unknown)}; use the customerId values {where}")


def no_task(ctx: ToolContext, task_id: str) -> ToolArgumentError:
    source = ("that createEmailTask returned" if ctx.offers("createEmailTask")
              else "of an existing e-mail task")
    # The same words for a task of another conversation: whether it exists
    # there is not this conversation's to know.
    return ToolArgumentError(f"no e-mail task {task_id} in this conversation; use the taskId "
                             f"{source}")


def explain(task: EmailTask) -> str:
    """An e-mail task's status in words (no tool names: every service that
    shows a task can show this)."""
    match task.status:
        case EmailStatus.QUEUED:
            return "queued; nothing has been sent yet. The sender delivers it shortly"
        case EmailStatus.SENDING:
            return "being delivered right now"
        case EmailStatus.SENT:
            return f"accepted by the SMTP server at {task.sent_at}"
        case EmailStatus.FAILED if task.possibly_sent:
            return (
                "delivery was interrupted: it may or may not have arrived. It is not "
                "retried automatically; a person must check the recipient's mailbox"
            )
        case EmailStatus.FAILED:
            return (
                f"attempt {task.attempts} failed; the sender retries it at {task.next_attempt_at}"
            )
        case EmailStatus.DEAD:
            return f"gave up after {task.attempts} attempt(s); it was not sent"
        case EmailStatus.CANCELLED:
            return "cancelled before it was sent"
    return task.status.value
