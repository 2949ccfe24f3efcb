"""The reference application's services: `sales-assistant` (its tools and
prompt) and `sales-compact`, the same scenario for small local models
(docs/sales.md, docs/local-models.md)."""

from __future__ import annotations

from turnstile import ModelSettings, OutboundPolicy, Service, ToolRegistry
from turnstile.sales.approvers import table_approvers
from turnstile.sales.documents import SALES_DOCUMENTS
from turnstile.sales.sales_tools import (
    checkEmailConfig,
    createEmailTask,
    createFollowUpTask,
    getEmailTaskStatus,
    querySalesData,
    retryEmailTask,
)

SERVICE_NAME = "sales-assistant"
COMPACT_SERVICE_NAME = "sales-compact"
# Where createEmailTask may send: the demo's own domain. Others are an argument
# error the model sees (build_sales_service(outbound=...) widens it).
DEFAULT_OUTBOUND = OutboundPolicy(allowed_domains=["example.com"])

# {{today}}, {{weekday}} and {{date_ranges}} are built-in variables (the
# workflow's clock; turnstile.engine.date_ranges): the model copies the dates a
# request names instead of working them out (a 1.5B model got "last
# week" wrong in 10 of 10 runs).
SYSTEM_PROMPT = """\
You are a sales follow-up assistant. Today is {{weekday}}, {{today}}.
Date ranges (ISO, both dates inclusive):
{{date_ranges}}

You work only through the tools. Never invent customers, amounts, dates, task ids
or delivery results: every number you state comes from a tool result, copied as
it is (amounts are already formatted). If a tool returns noDataReason or an error,
say so plainly instead of guessing.

To find customers whose sales exceeded an amount in a period, call querySalesData
with ISO dates (YYYY-MM-DD, both inclusive; for a period named above, copy its two
dates) and minAmount as a plain number. If totalCount is larger
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


# Measured on Qwen2.5-Coder-1.5B: with the full prompt, three
# retrieved documents and six tools the first token is a tool call with
# probability 0.21; a short prompt, no documents and two tools, 0.64.
COMPACT_PROMPT = """\
You are a sales assistant. Today is {{weekday}}, {{today}}. Dates (inclusive):
{{date_ranges}}
Use the tools; never invent customers or amounts. Find customers with
querySalesData (startDate and endDate copied from the dates above, minAmount as
a number). To have someone follow up, call createEmailTask once, after the query
returned: one recipient, a short subject, and a body to that recipient listing
each customer found, name and total, copied from the result (no placeholders).
Then answer briefly: the customers found, by name, and the e-mail's taskId."""

# What a small local model needs besides the short prompt: a bounded reply,
# little randomness, schemas a grammar-compiling server accepts, no documents,
# and its calls read when the server's template leaves them as text
# (docs/local-models.md).
COMPACT_MODEL = ModelSettings(max_tokens=1024, temperature=0.2, schema_dialect="grammar",
                              documents=False, text_tool_calls=True)


def build_compact_sales_service(outbound: OutboundPolicy = DEFAULT_OUTBOUND) -> Service:
    """`sales-compact`: the sales scenario with a short prompt, only the two
    tools it needs (querySalesData, createEmailTask) and no documents, for
    small local models (docs/sales.md; bench/real_model.py runs it)."""
    return Service(
        name=COMPACT_SERVICE_NAME,
        description="The sales follow-up scenario, compact: for small local models",
        system_prompt=COMPACT_PROMPT,
        tools=ToolRegistry([querySalesData, createEmailTask]),
        approvers=table_approvers,
        outbound=outbound,
        on_new_message="steer",
        model=COMPACT_MODEL,
    )
