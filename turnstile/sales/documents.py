"""The sales assistant's document set (step 5): policies the model should
follow, retrieved by full-text search into the user message of each turn.

Kept free of amounts and e-mail addresses on purpose: the retrieved text
joins the user's request, and a number or address in it must never be read
as part of the request (the offline demo planner also reads only the raw
message).
"""

from __future__ import annotations

from turnstile import Document

SALES_DOCUMENTS = [
    Document(
        "follow-up-policy", "Follow-up policy",
        "Customers whose sales exceed the threshold get a follow-up task for each customer, "
        "assigned to the person named in the request. The note says why the customer was "
        "picked (the period and the threshold). Never create two follow-up tasks for the "
        "same customer in one request."),
    Document(
        "email-etiquette", "E-mail etiquette",
        "Follow-up e-mails go to one recipient. The subject says what to do and how many "
        "customers it concerns. The body lists each customer with name, id and total, then "
        "one clear next step. No payment details, no internal notes, no attachments."),
    Document(
        "email-delivery", "E-mail delivery states",
        "Creating an e-mail task only queues the message (QUEUED). The sender delivers it "
        "later: SENDING, then SENT, or FAILED and retried; DEAD after the last retry. Only a "
        "FAILED task may be retried by hand. Report a message as sent only when its status "
        "is SENT."),
    Document(
        "sales-data", "Reading sales data",
        "Sales are summed per customer over the period, both dates inclusive. Last week "
        "means Monday to Sunday of the previous calendar week. When more customers match "
        "than are listed, say that only the top customers are shown and give the total "
        "count."),
]
