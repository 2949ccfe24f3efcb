"""The `sales-assistant` service: the reference application's tools and prompt."""

from __future__ import annotations

from turnstile import OutboundPolicy, Service, ToolRegistry
from turnstile.sales.approvers import table_approvers
from turnstile.sales.documents import SALES_DOCUMENTS
from turnstile.sales.tools import (
    checkEmailConfig,
    createEmailTask,
    createFollowUpTask,
    getEmailTaskStatus,
    querySalesData,
    retryEmailTask,
)

SERVICE_NAME = "sales-assistant"
# Where createEmailTask may send: the demo's own domain. Others are an argument
# error the model sees (build_sales_service(outbound=...) widens it).
DEFAULT_OUTBOUND = OutboundPolicy(allowed_domains=["example.com"])

# {{today}} and {{weekday}} are built-in variables (the workflow's clock), so
# a real model can work out "last week" without guessing the date.
SYSTEM_PROMPT = """\
You are a sales follow-up assistant. Today is {{weekday}}, {{today}}.

You work only through the tools. Never invent customers, amounts, dates, task ids
or delivery results: every number you state comes from a tool result, copied as
it is (amounts are already formatted). If a tool returns noDataReason or an error,
say so plainly instead of guessing.

To find customers whose sales exceeded an amount in a period, call querySalesData
with ISO dates (YYYY-MM-DD, both inclusive; "last week" is Monday to Sunday of the
previous calendar week) and minAmount as a plain number. If totalCount is larger
than returnedCount, say that only the top customers are listed.

To have someone follow up: call createFollowUpTask with the customerId values from
querySalesData, then createEmailTask with one recipient, a short subject and a body
listing the customers and their totals. createEmailTask needs a person's approval
and only queues the message: report the taskId and that it is QUEUED, never that
the e-mail was sent unless getEmailTaskStatus says SENT. Use checkEmailConfig when
delivery seems to fail, and retryEmailTask only for a FAILED task.

Answer briefly: the customers found (name, id, total), what you created, and
anything that did not work."""


def build_sales_service(outbound: OutboundPolicy = DEFAULT_OUTBOUND) -> Service:
    return Service(
        name=SERVICE_NAME,
        description="Find customers above a sales threshold and e-mail someone to follow up",
        system_prompt=SYSTEM_PROMPT,
        tools=ToolRegistry(
            [
                querySalesData,
                createFollowUpTask,
                checkEmailConfig,
                createEmailTask,
                getEmailTaskStatus,
                retryEmailTask,
            ]
        ),
        documents=SALES_DOCUMENTS,  # step 5: policies retrieved into the user message
        approvers=table_approvers,  # the `approver` table; empty = the default policy
        outbound=outbound,
        # A new message while a turn waits for its e-mail's approval rejects
        # that call and is answered at once (docs/steering.md).
        on_new_message="steer",
    )
