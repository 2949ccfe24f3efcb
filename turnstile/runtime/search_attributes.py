"""Turnstile's search attributes: make waiting turns easy to find.

    temporal workflow list --query 'TurnstilePendingApprovals > 0'
    temporal workflow list --query 'TurnstileConversation = "c-42"'
    temporal workflow list --query "TurnstileUser = 'alice' AND ExecutionStatus = 'Running'"

The worker registers them when missing (a dev server allows it; on a cluster
an operator may have to: `temporal operator search-attribute create`). If
they cannot be registered, turns still publish the same facts in their memo.
"""

from __future__ import annotations

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError

from turnstile.engine import search_keys

log = logging.getLogger(__name__)

# name -> type, of the keys turnstile.engine.search_keys declares
ATTRIBUTES: dict[str, IndexedValueType.ValueType] = {
    key.name: IndexedValueType.ValueType(key.indexed_value_type) for key in search_keys.ALL}


async def ensure_search_attributes(client: Client, namespace: str) -> bool:
    """True when all of Turnstile's search attributes exist (registering missing ones)."""
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace))
        missing = {k: v for k, v in ATTRIBUTES.items() if k not in listed.custom_attributes}
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=namespace, search_attributes=missing))
            log.info("registered search attributes %s", ", ".join(missing))
        return True
    except RPCError as exc:
        log.warning("search attributes unavailable (%s); turns publish a memo only", exc.message)
        return False
