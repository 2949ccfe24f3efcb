"""Turnstile's search attributes, declared once: the turn upserts them
(turnstile.workflows.state), the worker registers them
(turnstile.runtime.search_attributes), the client, the approvals listing and
steering read them. Their names are a compatibility contract (operators'
saved queries, `temporal workflow list --query ...`): add, never rename."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

STATUS = SearchAttributeKey.for_keyword("TurnstileStatus")  # the turn's step or ending
PENDING_APPROVALS = SearchAttributeKey.for_int("TurnstilePendingApprovals")
CONVERSATION = SearchAttributeKey.for_keyword("TurnstileConversation")
USER = SearchAttributeKey.for_keyword("TurnstileUser")
SERVICE = SearchAttributeKey.for_keyword("TurnstileService")

ALL: tuple[SearchAttributeKey[str] | SearchAttributeKey[int], ...] = (
    STATUS, PENDING_APPROVALS, CONVERSATION, USER, SERVICE)
