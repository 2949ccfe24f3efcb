"""One process that serves the task queue (workflows and activities) for the
apps of TURNSTILE_APPS (unset: the sales reference app) and runs their
background processes (the sales app's e-mail sender). `--no-sender` /
`--sender-only` split them for scaling. Configuration comes only from the
environment (docs/contract.md); an app or plugin that cannot be imported is
one line and exit 2."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from turnstile.activities import Runtime
from turnstile.providers import build_provider
from turnstile.runtime import event_loop, log_masking
from turnstile.runtime.apps import (
    App,
    AppLoadError,
    BackgroundContext,
    demo_scripts_of,
    load_apps,
    services_of,
    tables_by_app,
)
from turnstile.runtime.client import connect, metrics_runtime
from turnstile.runtime.config import Settings
from turnstile.runtime.payload_visits import walk_once
from turnstile.runtime.plugins import load_services
from turnstile.runtime.search_attributes import ensure_search_attributes
from turnstile.runtime.tracing import interceptors as tracing_interceptors, setup_tracing
from turnstile.runtime.upgrade import older_turns, refusal
from turnstile.runtime.versioning import deployment_of, settle_current
from turnstile.runtime.worker_processes import report_ready, supervise
from turnstile.stores.schema import upgrade
from turnstile.stores.schema_window import NewerSchema
from turnstile.temporal_plugin import TurnstilePlugin, sandbox_passthrough

log = logging.getLogger("turnstile.worker")
# Exit status when turns of an older version run (turnstile.runtime.upgrade).
EXIT_OLDER_TURNS = 3


def workflow_runner(sandbox: str) -> WorkflowRunner:
    """How workflow code runs (TURNSTILE_WORKFLOW_SANDBOX).

    "off" (the default): without Temporal's sandbox. The sandbox re-imports the
    workflow modules for every run and routes every activation and payload
    conversion through its import hooks: measured interleaved on the bench
    turn, it costs about a quarter of a turn's worker CPU (bench/HISTORY.md).
    The only code it would guard is Turnstile's own workflow code — services,
    tools, guardrails and plugins run in activities — and that code is
    checked in CI instead: the test suite runs every turn under "strict",
    tests/test_determinism.py scans workflow and engine code for clocks,
    randomness, environment and I/O, and recorded histories replay.
    "strict": Temporal's default sandbox, the engine passed through, and the
    standards' libraries it uses (identity: precis_i18n; masking: phonenumbers,
    regex) with it: loaded once by the worker, never re-imported for a turn."""
    if sandbox == "off":
        return UnsandboxedWorkflowRunner()
    passed = sandbox_passthrough(SandboxRestrictions.default)
    return SandboxedWorkflowRunner(restrictions=passed)


ACTIVITY_SLOTS = 32
LOCAL_ACTIVITY_SLOTS = 32


def build_worker(client: Client, rt: Runtime, **overrides: object) -> Worker:
    """The Temporal worker for one runtime (tests pass their own client/runtime).
    The turn's workflow, activities, interceptors and workflow-failure types
    come from a TurnstilePlugin: the client's (`run` connects with one), else
    one around `rt` given to this worker. Activities in `overrides` under a
    turn activity's name (stand-ins) replace the plugin's."""
    walk_once()  # each activation's payloads visited in one walk (payload_visits)
    on_client = any(isinstance(p, TurnstilePlugin)
                    for p in client.config().get("plugins", ()))
    options: dict[str, object] = {
        "task_queue": rt.settings.task_queue,
        "plugins": [] if on_client else [plugin_for(rt)],
        "workflow_runner": workflow_runner(rt.settings.workflow_sandbox),
        # Sync activities (database work) run on this pool.
        "activity_executor": concurrent.futures.ThreadPoolExecutor(max_workers=ACTIVITY_SLOTS),
        "max_concurrent_activities": ACTIVITY_SLOTS,
        "max_concurrent_local_activities": LOCAL_ACTIVITY_SLOTS,
        # SIGTERM: running activities get this long to finish; then the model
        # calls still running are handed back (activities.runtime.with_heartbeat).
        "graceful_shutdown_timeout": timedelta(seconds=rt.settings.shutdown_grace_seconds),
        # The claim check (turnstile.stores.payload_store) stores or fetches a
        # payload only when it is large, which is rare; with the SDK's default
        # (3 concurrent) every payload of every activation is visited in a task
        # of its own, ~5% of the worker's CPU in a turn (bench/HISTORY.md).
        # 1: visited in order, no task per payload.
        "max_workflow_task_external_storage_concurrency": 1,
        "max_cached_workflows": rt.settings.max_cached_workflows,
        # How long a cached turn's workflow task waits for this worker before
        # another worker takes it (TURNSTILE_STICKY_QUEUE_TIMEOUT_SECONDS).
        "sticky_queue_schedule_to_start_timeout":
            timedelta(seconds=rt.settings.sticky_queue_timeout_seconds),
    }
    deployment = deployment_of(rt.settings)
    if deployment is not None:
        options["deployment_config"] = deployment.worker_config
    options.update(overrides)
    return Worker(client, **options)  # type: ignore[arg-type]


def plugin_for(rt: Runtime, served: Sequence[App] = ()) -> TurnstilePlugin:
    """The plugin of this worker: around its runtime, the serving duties
    (migration, search attributes, background processes) left to `run`,
    which has its own options for them. Fails the turn, not its workflow
    task, on errors no retry can fix (workflows/agent_turn.py, FAILS_THE_TURN;
    docs/design.md); a value the database refuses is never retried as an
    outage (activities.data_errors)."""
    return TurnstilePlugin(served, runtime=rt, serve=False)


# Exit status when an app or plugin cannot be loaded (turnstile.runtime.apps).
EXIT_BAD_APP = 2
# Exit status when the database is at a newer revision older code may not run
# on (turnstile.stores.schema_window).
EXIT_NEWER_SCHEMA = 2


def apps(settings: Settings | None = None) -> list[App]:
    """The apps this worker serves: TURNSTILE_APPS, unset the reference app
    (services from TURNSTILE_PLUGINS join them, turnstile.runtime.plugins)."""
    return load_apps(settings or Settings.from_env())


async def run(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--no-sender", action="store_true", help="do not run the e-mail sender")
    group.add_argument("--sender-only", action="store_true", help="run only the e-mail sender")
    parser.add_argument("--app", action="append", default=[], metavar="MOD:ATTR",
                        help="serve this app (repeatable; instead of TURNSTILE_APPS)")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="run N worker processes, the e-mail sender in the first "
                             "(turnstile.runtime.worker_processes; docs/scaling.md)")
    args = parser.parse_args(argv)
    if args.app:  # as TURNSTILE_APPS would name them (and so for --processes' children)
        os.environ["TURNSTILE_APPS"] = ",".join(args.app)

    settings = Settings.from_env()
    if args.processes != 1:
        if args.processes < 1 or args.sender_only:
            parser.error("--processes takes a number of at least 1, and not with --sender-only")
        command = [sys.executable, "-m", "turnstile.cli.worker"]
        raise SystemExit(await supervise(args.processes, command,
                                         sys.argv[1:] if argv is None else argv,
                                         settings.shutdown_grace_seconds))
    # What is served is loaded first: an app or plugin that cannot be
    # imported is the only thing said (main: one line, exit 2).
    served = apps(settings)
    registry = load_services(settings, services_of(served))
    setup_tracing(settings, "turnstile-worker")
    loop = asyncio.get_running_loop()
    reserve_threads(loop)
    rt = Runtime.build(settings, registry, build_provider(settings, demo_scripts_of(served)))
    client = None
    runtime = metrics_runtime(settings)  # the Prometheus endpoint, when a port is set
    if runtime is not None:
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    if not args.sender_only:
        # What the worker would refuse is checked before anything is migrated:
        # a refused upgrade leaves the schema as the running release made it.
        client = await connect(settings, interceptors=tracing_interceptors(), runtime=runtime,
                               plugins=[plugin_for(rt, served)])
        if settings.upgrade_check:
            older = await older_turns(
                client, unversioned_only=deployment_of(settings) is not None)
            if older:
                log.error("%s", refusal(older, settings.temporal_namespace))
                raise SystemExit(EXIT_OLDER_TURNS)
    # Migrate to the newest schema (a v0.1 database is stamped first), then
    # grant what the apps' tables name.
    upgrade(rt.db, apps=tables_by_app(served))
    stop = threading.Event()
    done = asyncio.Event()

    def shutdown() -> None:
        stop.set()
        done.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown)

    tasks: list[asyncio.Future[object]] = []
    if not args.no_sender:
        background = BackgroundContext(rt.db, settings, stop,
                                       runtime.metric_meter if runtime else None)
        for app in served:
            for name, process in app.background.items():
                tasks.append(asyncio.ensure_future(asyncio.to_thread(process, background)))
                log.info("%s running (app %s)", name, app.name)
    if client is None:
        await done.wait()
    else:
        rt.search_attributes = await ensure_search_attributes(client, settings.temporal_namespace)
        worker = build_worker(client, rt)
        log.info("worker serving task queue %r on %s (%s, provider %s, event loop %s)",
                 settings.task_queue, settings.temporal_address, rt.db, rt.provider.name,
                 type(loop).__module__.partition(".")[0])
        async with worker:
            deployment = deployment_of(settings)
            if deployment is not None:
                log.info("%s", await settle_current(client, deployment, settings.make_current))
            report_ready()  # to the supervisor of `--processes N`, if any
            await done.wait()
            log.info("shutting down: running activities get %.0f s to finish",
                     settings.shutdown_grace_seconds)
        log.info("worker stopped")
        await close_mcp_sessions()  # stdio MCP servers end with the worker
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await rt.provider.aclose()


async def close_mcp_sessions() -> None:
    """Close the MCP sessions this worker opened (none if no service has an
    MCP server: the client library was then never imported)."""
    opened = sys.modules.get("turnstile.runtime.mcp.sessions")
    if opened is not None:
        await opened.connections.close_all()


def reserve_threads(loop: asyncio.AbstractEventLoop) -> None:
    """Threads for `asyncio.to_thread`: tools, and activities' database work on
    PostgreSQL (on SQLite it runs on the loop: turnstile.stores.db, `Database.call`).
    Python's default pool has min(32, cores + 4) threads — 6 on two cores — and
    the e-mail sender holds one for its life: with tens of approvals landing at
    once, their database hops queued behind each other, and on SQLite writers
    waited out the busy timeout (bench/parked.py, "database is locked"). As many
    threads as activity slots, plus room for the sender and local activities."""
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
        max_workers=ACTIVITY_SLOTS + LOCAL_ACTIVITY_SLOTS + 16,
        thread_name_prefix="turnstile-db"))


def main(argv: list[str] | None = None) -> None:
    settings = Settings.from_env()
    log_masking.setup(logging.INFO, settings.log_format)
    try:
        event_loop.run(run(argv), settings.event_loop)
    except AppLoadError as exc:  # one line, not a traceback
        log.error("%s", exc)
        raise SystemExit(EXIT_BAD_APP) from None
    except NewerSchema as exc:  # one line naming the revision
        log.error("%s", exc)
        raise SystemExit(EXIT_NEWER_SCHEMA) from None


if __name__ == "__main__":
    main()
