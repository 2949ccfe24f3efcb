"""`TurnstilePlugin`: turns on your own Temporal worker, on its task queue.

    plugin = TurnstilePlugin([app])
    client = await Client.connect("localhost:7233", plugins=[plugin])
    worker = Worker(client, task_queue="my-queue", workflows=[MyWorkflow],
                    activities=[my_activity])          # yours, beside the turn's
    turns = TurnstileClient(client, plugin.settings, task_queue="my-queue")

On temporalio's plugin API (temporalio.plugin.SimplePlugin), as the SDK's
own contrib integrations are: given to `Client.connect(plugins=...)` it sets
the data converter (pydantic JSON, large payloads claim-checked into the
database) and passes itself on to every Worker of that client, which it gives
the turn workflow (`AgentTurn`), its activities, the workflow-failure types
that fail a turn instead of retrying its task, Turnstile's worker
interceptors and, under Temporal's sandbox, the pass-throughs its engine
needs. While the worker runs, the plugin migrates the database (the apps'
tables too), registers Turnstile's search attributes and runs the apps'
background processes (e.g. an e-mail sender). A Replayer given the plugin
replays turn histories.

The settings are the environment's (docs/contract.md) unless given; the
task queue is the worker's own, whatever TURNSTILE_TASK_QUEUE says. What the
worker already has wins: an activity of its own under a turn activity's name
(a stand-in) replaces the plugin's, an interceptor of a type the plugin adds
is not added twice, its own workflow runner is kept (a sandbox gets the
pass-throughs).

`turnstile worker` (turnstile.cli.worker) is a user of the plugin: it builds
its runtime and does the serving duties itself (with its own options:
`--no-sender`, `--sender-only`, the upgrade check before migrating), so it
passes `runtime=` and `serve=False`, and adds its worker options (slots,
shutdown grace, deployment)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import pkgutil
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from temporalio import activity
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    Interceptor,
    ReplayerConfig,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerConfig,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

import turnstile
from turnstile.activities import Runtime, all_activities
from turnstile.activities.data_errors import DataErrors
from turnstile.activities.log_context import LogContext
from turnstile.providers import ModelProvider, build_provider
from turnstile.runtime.apps import (
    App,
    BackgroundContext,
    demo_scripts_of,
    services_of,
    tables_by_app,
)
from turnstile.runtime.client import converter
from turnstile.runtime.config import Settings
from turnstile.runtime.plugins import load_services
from turnstile.runtime.search_attributes import ensure_search_attributes
from turnstile.stores.schema import upgrade
from turnstile.workflows import AgentTurn
from turnstile.workflows.agent_turn import FAILS_THE_TURN

__all__ = ["TurnstilePlugin", "package_passthrough", "sandbox_passthrough"]

# The standards' libraries the engine uses (identity: precis_i18n; masking:
# phonenumbers, regex): loaded once by the worker, never re-imported for a turn.
LIBRARIES = ("precis_i18n", "phonenumbers", "regex")
# The activity thread pool the plugin gives a worker that has none (as many as
# `turnstile worker` runs activities at once).
ACTIVITY_THREADS = 32


def package_passthrough() -> list[str]:
    """Every module of the package but its workflow code (turnstile.workflows,
    which the sandbox imports afresh for each run and so guards; a pass-through
    of "turnstile" itself would pass it through too, unguarded)."""
    return [f"turnstile.{found.name}" for found in pkgutil.iter_modules(turnstile.__path__)
            if found.name != "workflows"]


def sandbox_passthrough(restrictions: SandboxRestrictions) -> SandboxRestrictions:
    """`restrictions` with what turn workflow code may share with the worker."""
    return restrictions.with_passthrough_modules(*package_passthrough(), *LIBRARIES)


def _runner(existing: WorkflowRunner | None) -> WorkflowRunner:
    """The worker's runner, its sandbox (if any) passing the engine through."""
    if isinstance(existing, UnsandboxedWorkflowRunner):
        return existing
    if isinstance(existing, SandboxedWorkflowRunner):
        return dataclasses.replace(existing,
                                   restrictions=sandbox_passthrough(existing.restrictions))
    return SandboxedWorkflowRunner(restrictions=sandbox_passthrough(SandboxRestrictions.default))


def _activity_name(fn: Callable[..., Any]) -> str | None:
    """The name an activity is registered under (None: a dynamic activity)."""
    return activity._Definition.must_from_callable(fn).name


def _interceptors(existing: Sequence[Any] | None) -> list[Any]:
    """The worker's interceptors, and the plugin's of each type it lacks."""
    have = list(existing or [])
    ours: list[Interceptor] = [DataErrors(), LogContext()]
    return have + [i for i in ours if not any(type(h) is type(i) for h in have)]


class TurnstilePlugin(SimplePlugin):
    """Everything a Temporal worker needs to run turns of `apps` (see the
    module docstring). `settings`: default, the environment's. `model`: every
    service's model (default: LLM_BASE_URL's, else each service's
    `offline_model`). `runtime`: one already built (its settings, services and
    model are used; `apps` then only for serving). `serve=False`: the caller
    migrates the database, registers the search attributes and runs the apps'
    background processes itself."""

    def __init__(self, apps: App | Sequence[App], *, settings: Settings | None = None,
                 model: ModelProvider | None = None, runtime: Runtime | None = None,
                 serve: bool = True) -> None:
        self.apps = [apps] if isinstance(apps, App) else list(apps)
        self.serve = serve
        if runtime is None:
            settings = settings or Settings.from_env()
            provider = model or build_provider(settings, demo_scripts_of(self.apps))
            runtime = Runtime.build(
                settings, load_services(settings, services_of(self.apps)), provider)
        self.runtime = runtime
        self.settings = runtime.settings
        super().__init__(
            "turnstile.TurnstilePlugin",
            data_converter=self._converter,
            activities=self._activities,
            workflows=[AgentTurn],
            workflow_runner=_runner,
            workflow_failure_exception_types=list(FAILS_THE_TURN),
        )

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        config = super().configure_worker(config)
        config["interceptors"] = _interceptors(config.get("interceptors"))
        if config.get("activity_executor") is None:
            # Turnstile's sync activities (database work) need a thread pool.
            config["activity_executor"] = concurrent.futures.ThreadPoolExecutor(
                max_workers=ACTIVITY_THREADS, thread_name_prefix="turnstile-activity")
        return config

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        config = super().configure_replayer(config)
        config["interceptors"] = _interceptors(config.get("interceptors"))
        return config

    def _activities(self, existing: Sequence[Callable[..., Any]] | None,
                    ) -> list[Callable[..., Any]]:
        """The worker's activities, and the turn's it has no stand-in for."""
        have = list(existing or [])
        taken = {_activity_name(fn) for fn in have}
        return have + [fn for fn in all_activities(self.runtime)
                       if _activity_name(fn) not in taken]

    def _converter(self, existing: Any) -> Any:
        return converter(self.settings)

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Any]) -> None:
        if not self.serve:
            await next(worker)
            return
        async with self._serving(worker):
            await next(worker)

    @asynccontextmanager
    async def _serving(self, worker: Worker) -> AsyncIterator[None]:
        """The database migrated, the search attributes registered and the
        apps' background processes running while `worker` runs."""
        rt = self.runtime
        await asyncio.to_thread(upgrade, rt.db, apps=tables_by_app(self.apps))
        rt.search_attributes = await ensure_search_attributes(
            worker.client, worker.client.namespace)
        stop = threading.Event()
        background = BackgroundContext(rt.db, self.settings, stop)
        tasks = [asyncio.ensure_future(asyncio.to_thread(process, background))
                 for app in self.apps for process in app.background.values()]
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
