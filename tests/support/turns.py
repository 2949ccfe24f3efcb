"""Running turns against the shared dev server with an in-process worker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.support.databases import migrate
from tests.support.worker_env import WORKER_ENV
from turnstile.activities import Runtime
from turnstile.cli.worker import build_worker
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    Handlers,
    PendingApproval,
    TurnInput,
    TurnResult,
)
from turnstile.providers import ModelProvider
from turnstile.runtime.config import Settings
from turnstile.runtime.mcp import connections as mcp_connections
from turnstile.runtime.search_attributes import ensure_search_attributes
from turnstile.runtime.services import Service, ServiceRegistry
from turnstile.runtime.upgrade import opening_activity


class Turns:
    def __init__(self, client: Client, rt: Runtime) -> None:
        self.client, self.rt = client, rt

    async def start(self, message: str, *, conversation: str = "c-1", user: str = "alice",
                    service: str = "test", variables: dict[str, Any] | None = None,
                    workflow_id: str | None = None) -> WorkflowHandle[Any, TurnResult]:
        turn = TurnInput(conversation_id=conversation, user_id=user, message=message,
                         service=service, variables=variables or {"team": "qa"})
        return await self.client.start_workflow(
            WORKFLOW_TYPE, turn, id=workflow_id or f"t-{uuid.uuid4().hex[:12]}",
            task_queue=self.rt.settings.task_queue, result_type=TurnResult)

    async def run(self, message: str, **kw: Any) -> TurnResult:
        return await (await self.start(message, **kw)).result()


@asynccontextmanager
async def running_worker(client: Client, task_queue: str, database_url: str,
                         services: list[Service], provider: ModelProvider | None = None,
                         llm_url: str | None = None, env: dict[str, str] | None = None,
                         **worker_options: Any) -> AsyncIterator[Turns]:
    settings = Settings.from_env({
        **WORKER_ENV,  # the tests' worker settings (tests/support/worker_env.py)
        "TURNSTILE_TASK_QUEUE": task_queue, "DATABASE_URL": database_url,
        **({"LLM_BASE_URL": llm_url} if llm_url else {}), **(env or {}),
    })
    rt = Runtime.build(settings, ServiceRegistry(services), provider)
    migrate(rt.db)
    rt.search_attributes = await ensure_search_attributes(client, "default")
    async with build_worker(client, rt, **worker_options):
        yield Turns(client, rt)
    await mcp_connections.close_all()
    await rt.provider.aclose()


async def wait_pending(handle: WorkflowHandle[Any, Any], n: int = 1) -> list[PendingApproval]:
    """The turn's pending approvals once there are at least `n` (15 s at most)."""
    for _ in range(300):
        pending = await handle.query(Handlers.PENDING_APPROVALS, result_type=list[PendingApproval])
        if len(pending) >= n:
            return pending
        await asyncio.sleep(0.05)
    raise TimeoutError(f"fewer than {n} pending approval(s) appeared")


async def local_activities(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The local activities a turn ran, by type, in history order (one marker each)."""
    history = await handle.fetch_history()
    return [name for e in history.events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and (name := opening_activity([e])) is not None]
