"""What activities run against: one bundle per worker process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnstile.engine.errors import (
    ConfigurationError,
    MCPServerUnavailable,
    NotInWorkflow,
    TurnstileError,
    UnknownServiceError,
)
from turnstile.providers import DemoPlanner, ModelProvider, build_provider
from turnstile.runtime.config import Settings
from turnstile.runtime.event_bus import EventBus
from turnstile.runtime.services import Service, ServiceRegistry
from turnstile.runtime.tools import Tool
from turnstile.stores.db import Database
from turnstile.stores.journal import CallJournal
from turnstile.stores.ledger import ToolLedger
from turnstile.stores.memory import MemoryStore


@dataclass
class Runtime:
    settings: Settings
    db: Database
    services: ServiceRegistry
    provider: ModelProvider
    memory: MemoryStore
    ledger: ToolLedger  # reads; the journal writes the call facts
    journal: CallJournal
    search_attributes: bool = False  # set by the worker after checking the namespace
    events: EventBus = field(default_factory=EventBus)  # listeners of TurnStarted/Completed

    @classmethod
    def build(
        cls,
        settings: Settings,
        services: ServiceRegistry,
        provider: ModelProvider | None = None,
    ) -> Runtime:
        db = Database(settings.database_url, readonly_url=settings.database_readonly_url,
                      on_loop=settings.sqlite_on_loop)
        memory = MemoryStore(db)
        return cls(
            settings=settings,
            db=db,
            services=services,
            provider=provider or build_provider(settings),
            memory=memory,
            ledger=ToolLedger(db),
            journal=CallJournal(db, memory, audit_enabled=settings.audit),
        )

    def provider_for(self, service: str) -> ModelProvider:
        """The model a turn of `service` asks: the worker's; but where that is
        the offline demo planner (no LLM_BASE_URL), the service's own
        `offline_model` when it has one (a function model)."""
        if isinstance(self.provider, DemoPlanner):
            try:
                own = self.services.get(service).offline_model
            except TurnstileError:
                return self.provider
            if own is not None:
                return own
        return self.provider


class Activities:
    """A group of the worker's activities, run against its Runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def service(self, name: str) -> Service:
        """The worker's service `name`; an unknown one fails the activity for
        good (no retry serves it)."""
        try:
            return self.rt.services.get(name)
        except UnknownServiceError as exc:
            raise application_error(exc, non_retryable=True) from exc


def application_error(exc: TurnstileError, *, non_retryable: bool) -> ApplicationError:
    """A Temporal failure whose `type` is the error's stable name."""
    return ApplicationError(str(exc), type=exc.error_type, non_retryable=non_retryable)


T = TypeVar("T")


# The failure type of an attempt a worker handed back on shutdown (SIGTERM):
# retryable, so another worker runs the activity again at once.
WORKER_SHUTDOWN = "WorkerShutdown"


class WorkerShutdown(ApplicationError):
    """The attempt a shutting-down worker hands back (`with_heartbeat`)."""

    def __init__(self) -> None:
        super().__init__("the worker shut down during this attempt; another worker runs it "
                         "again", type=WORKER_SHUTDOWN)


async def with_heartbeat(work: Awaitable[T], heartbeat_seconds: float | None = None, *,
                         hand_back: bool = False,
                         details: Callable[[], Sequence[Any]] | None = None) -> T:
    """Heartbeat while `work` runs, so a lost worker is noticed within the
    heartbeat timeout (not the much longer start-to-close timeout) and a
    cancellation reaches the work. `heartbeat_seconds` None: the activity's
    own heartbeat timeout.

    `hand_back`: when the worker shuts down (SIGTERM, after its grace period)
    while `work` still runs, the attempt fails as retryable `WorkerShutdown`
    instead of ending as cancelled, so the server gives it to another worker
    at once. Only for work that is safe to run again (a model request), or
    whose caller decides what a hand-back means (a tool call).

    `details`: what each heartbeat carries (the model call's count of
    identical refusals, activities/model_refusals.py); none by default."""
    if heartbeat_seconds is None:
        timeout = activity.info().heartbeat_timeout
        heartbeat_seconds = timeout.total_seconds() if timeout else None
    interval = max(0.5, (heartbeat_seconds or 10.0) / 3)

    async def beat() -> None:
        # The first beat is due an interval after the start, not at once: work
        # shorter than that (most model and tool calls) sends no heartbeat at
        # all, one RPC fewer to the server per activity; the heartbeat timeout
        # (3 intervals) still notices a lost worker.
        while True:
            await asyncio.sleep(interval)
            activity.heartbeat(*(details() if details is not None else ()))

    beater = asyncio.create_task(beat())
    try:
        return await work
    except asyncio.CancelledError:
        why = activity.cancellation_details()
        if hand_back and why is not None and why.worker_shutdown \
                and not why.cancel_requested:
            raise WorkerShutdown() from None
        raise
    finally:
        beater.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beater


async def find_tool(service: Service, name: str,
                    heartbeat_seconds: float | None = None) -> Tool | None:
    """The service's tool `name`, or None. An MCP tool this worker has not
    listed yet (e.g. after a restart) is listed first, heartbeating: opening
    sessions may outlast a heartbeat timeout. A configuration error fails the
    activity for good; an MCP server that cannot be reached, this attempt."""
    try:
        return await with_heartbeat(service.find_tool(name), heartbeat_seconds)
    except ConfigurationError as exc:
        raise application_error(exc, non_retryable=True) from exc
    except MCPServerUnavailable as exc:
        raise application_error(exc, non_retryable=False) from exc


def model_name(rt: Runtime, service: str = "") -> str | None:
    """The model this worker asks for `service` (None: the provider's own,
    e.g. the demo planner)."""
    name = getattr(rt.provider_for(service) if service else rt.provider, "model", None)
    return name if isinstance(name, str) and name else rt.settings.llm_model


def turn_workflow_id() -> str:
    """The id of the turn running this activity. Turnstile's activities only
    make sense inside a turn (the SDK types the id optional for standalone
    activities)."""
    wf_id = activity.info().workflow_id
    if not wf_id:
        raise application_error(NotInWorkflow(
            "Turnstile activities run only inside an AgentTurn workflow"), non_retryable=True)
    return wf_id
