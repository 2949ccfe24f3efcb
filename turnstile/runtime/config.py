"""Configuration from the environment (docs/contract.md). Read by the worker,
activities and the starter, never by workflow code."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.envconfig import ClientConfigProfile

from turnstile.engine.contract import DEFAULT_TASK_QUEUE
from turnstile.engine.errors import ConfigurationError
from turnstile.engine.model_settings import SCHEMA_DIALECTS, SchemaDialect

# The project a command runs for: the directory it was started in (in this
# repository, the checkout; in yours, your folder). Nothing is read from the
# installed package's location.
PROJECT_ROOT = Path.cwd()
DATA_DIR = Path(os.environ.get("TURNSTILE_DATA_DIR", PROJECT_ROOT / ".data"))


# What Temporal's environment configuration reads (besides TEMPORAL_GRPC_META_*),
# as the `temporal` CLI does: docs/contract.md, "Connecting to Temporal".
TEMPORAL_ENV = ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_PROFILE",
                "TEMPORAL_CONFIG_FILE", "TEMPORAL_TLS", "TEMPORAL_TLS_CLIENT_CERT_PATH",
                "TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
                "TEMPORAL_TLS_SERVER_NAME", "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION")


def _flag(value: str | None, default: bool) -> bool:
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() not in ("0", "off", "false", "no")


@dataclass(frozen=True)
class Settings:
    temporal_address: str = "localhost:7233"
    temporal_namespace: str = "default"
    # Temporal's environment configuration (temporalio.envconfig): the profile
    # TEMPORAL_PROFILE (default "default") of TEMPORAL_CONFIG_FILE (default
    # ~/.config/temporalio/temporal.toml), overridden by TEMPORAL_ADDRESS,
    # TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS_* — the same settings
    # the `temporal` CLI reads. Its TLS, API key and gRPC metadata go to every
    # connection (turnstile.runtime.client.connect).
    temporal_profile: ClientConfigProfile = field(default_factory=ClientConfigProfile,
                                                  compare=False, repr=False)
    # The Temporal Web UI, for the links the starter and the inbox print.
    web_ui_url: str = "http://localhost:8233"
    task_queue: str = DEFAULT_TASK_QUEUE
    database_url: str = f"sqlite:///{DATA_DIR / 'turnstile.db'}"
    database_readonly_url: str | None = None
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    llm_model: str | None = None
    llm_timeout_seconds: float = 120.0
    # LLM_SCHEMA_DIALECT: how tool schemas are written on the wire for a service
    # that does not choose (ModelSettings.schema_dialect): "grammar" (default;
    # what llama.cpp's servers compile) or "full" (turnstile.engine.schema_dialect).
    llm_schema_dialect: SchemaDialect = "grammar"
    smtp_host: str = "localhost"
    smtp_port: int = 8025
    audit: bool = True
    data_dir: Path = DATA_DIR
    plugins: tuple[str, ...] = ()
    # TURNSTILE_APPS: the apps served, `module:attribute` (turnstile.runtime.apps;
    # empty: the reference app).
    apps: tuple[str, ...] = ()
    payload_threshold: int = 256 * 1024  # bytes; larger payloads are claim-checked
    sender_stale_seconds: float = 300.0  # a SENDING task older than this was lost mid-send
    otlp_endpoint: str | None = None
    mcp_servers: str = ""  # TURNSTILE_MCP_SERVERS (JSON), parsed by runtime.plugins
    # The model's context size in tokens, for memory windows (unset: from the
    # model's name, 8,192 for a name Turnstile does not know).
    context_tokens: int | None = None
    # SIGTERM: the worker stops polling and lets running activities finish this
    # long; what is still running then is handed back (failed as WorkerShutdown,
    # retried at once by another worker).
    shutdown_grace_seconds: float = 20.0
    # Refuse to start while turns of an older command-sequence version run
    # (turnstile.runtime.upgrade). TURNSTILE_UPGRADE_CHECK=off skips it.
    upgrade_check: bool = True
    # Worker Versioning (turnstile.runtime.versioning): the worker runs as the
    # Worker Deployment Version `deployment_name`/`build_id` (None: the default
    # build id) and turns are pinned to it. Off: an unversioned worker.
    worker_versioning: bool = True
    deployment_name: str = "turnstile"
    build_id: str | None = None
    # When the worker makes its version current: "first" (no version is yet),
    # "always", "never".
    make_current: str = "first"
    # How workflow code runs (worker.workflow_runner): "off" (default) runs it
    # without Temporal's sandbox; "strict" in Temporal's sandbox, as the test
    # suite runs it. Only Turnstile's own workflow code runs there (services,
    # tools and plugins run in activities), and CI checks it under "strict".
    workflow_sandbox: str = "off"
    # Turns kept in the worker's workflow cache (sticky execution). A parked
    # turn (waiting for approval) costs ~70 KiB of worker memory while cached;
    # one evicted is replayed from history when it resumes (bench/parked.py).
    max_cached_workflows: int = 1000
    # After a worker is lost, a cached turn's next workflow task waits up to
    # this long on the lost worker's sticky queue before it moves to the task
    # queue, where another worker replays the turn (the server sends none
    # there once the worker has not polled for 10 s). Shorter: a turn waits less
    # after its worker dies; too short: a busy worker slow to poll loses its
    # turns to the task queue (each a full replay). The SDK's default, 10 s.
    sticky_queue_timeout_seconds: float = 10.0
    # "json": one JSON object per log line (turnstile.runtime.log_masking).
    log_format: str = "text"
    # The worker's event loop (turnstile.runtime.event_loop): "auto" (uvloop
    # when installed), "uvloop" or "asyncio".
    event_loop: str = "auto"
    # On SQLite, activities run their own database work on the event loop, not
    # in threads (turnstile.stores.db, `Database.call`). Off: in threads, as on
    # PostgreSQL (for journaled tools that hold SQLite's write lock for long).
    sqlite_on_loop: bool = True
    # The worker's Prometheus endpoint on 127.0.0.1 (None: no endpoint):
    # Temporal's SDK metrics and Turnstile's own (`turnstile_*`).
    metrics_port: int | None = None
    # The interface it listens on (0.0.0.0 in containers, for the scraper).
    metrics_host: str = "127.0.0.1"
    # Per-user daily token budget (prompt + completion tokens since UTC
    # midnight, from `model_usage`): a model call of a user at or over it is
    # refused (BudgetExceeded, the turn ends `refused`). None: no budget.
    daily_token_budget: int | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        d = cls()
        profile = ClientConfigProfile.load(override_env_vars=dict(e))
        return cls(
            temporal_address=profile.address or d.temporal_address,
            temporal_namespace=profile.namespace or d.temporal_namespace,
            temporal_profile=profile,
            web_ui_url=(e.get("TURNSTILE_WEB_UI_URL") or d.web_ui_url).rstrip("/"),
            task_queue=e.get("TURNSTILE_TASK_QUEUE") or d.task_queue,
            database_url=e.get("DATABASE_URL") or d.database_url,
            database_readonly_url=e.get("DATABASE_READONLY_URL") or None,
            llm_base_url=(e.get("LLM_BASE_URL") or "").rstrip("/") or None,
            llm_api_key=e.get("LLM_API_KEY") or None,
            llm_model=e.get("LLM_MODEL") or None,
            llm_timeout_seconds=float(e.get("LLM_TIMEOUT_SECONDS") or d.llm_timeout_seconds),
            llm_schema_dialect=_dialect(e.get("LLM_SCHEMA_DIALECT")),
            smtp_host=e.get("SMTP_HOST") or d.smtp_host,
            smtp_port=int(e.get("SMTP_PORT") or d.smtp_port),
            audit=_flag(e.get("TURNSTILE_AUDIT"), True),
            sqlite_on_loop=_flag(e.get("TURNSTILE_SQLITE_ON_LOOP"), True),
            data_dir=Path(e.get("TURNSTILE_DATA_DIR") or DATA_DIR),
            sender_stale_seconds=float(e.get("TURNSTILE_SENDER_STALE_SECONDS")
                                       or d.sender_stale_seconds),
            payload_threshold=int(e.get("TURNSTILE_PAYLOAD_THRESHOLD") or d.payload_threshold),
            otlp_endpoint=e.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
            mcp_servers=e.get("TURNSTILE_MCP_SERVERS") or "",
            context_tokens=int(e.get("TURNSTILE_CONTEXT_TOKENS") or 0) or None,
            shutdown_grace_seconds=float(e.get("TURNSTILE_SHUTDOWN_GRACE_SECONDS")
                                         or d.shutdown_grace_seconds),
            upgrade_check=(e.get("TURNSTILE_UPGRADE_CHECK") or "on").lower() != "off",
            worker_versioning=_flag(e.get("TURNSTILE_WORKER_VERSIONING"), True),
            deployment_name=e.get("TURNSTILE_DEPLOYMENT_NAME") or d.deployment_name,
            build_id=e.get("TURNSTILE_BUILD_ID") or None,
            make_current=_choice("TURNSTILE_MAKE_CURRENT", e.get("TURNSTILE_MAKE_CURRENT"),
                                 ("first", "always", "never")),
            log_format=(e.get("TURNSTILE_LOG_FORMAT") or "text").strip().lower(),
            event_loop=_choice("TURNSTILE_EVENT_LOOP", e.get("TURNSTILE_EVENT_LOOP"),
                               ("auto", "uvloop", "asyncio")),
            metrics_port=int(e.get("TURNSTILE_METRICS_PORT") or 0) or None,
            metrics_host=e.get("TURNSTILE_METRICS_HOST") or d.metrics_host,
            daily_token_budget=_budget(e.get("TURNSTILE_DAILY_TOKEN_BUDGET")),
            max_cached_workflows=int(e.get("TURNSTILE_MAX_CACHED_WORKFLOWS")
                                     or d.max_cached_workflows),
            sticky_queue_timeout_seconds=_seconds(
                "TURNSTILE_STICKY_QUEUE_TIMEOUT_SECONDS",
                e.get("TURNSTILE_STICKY_QUEUE_TIMEOUT_SECONDS"), d.sticky_queue_timeout_seconds),
            workflow_sandbox=_sandbox(e.get("TURNSTILE_WORKFLOW_SANDBOX") or "off"),
            plugins=tuple(p for p in (e.get("TURNSTILE_PLUGINS") or "").split(",") if p.strip()),
            apps=tuple(a.strip() for a in (e.get("TURNSTILE_APPS") or "").split(",")
                       if a.strip()),
        )


def _choice(name: str, value: str | None, choices: tuple[str, ...]) -> str:
    if not value:
        return choices[0]
    if value.strip().lower() not in choices:
        raise ConfigurationError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value.strip().lower()


def _dialect(value: str | None) -> SchemaDialect:
    wanted = (value or "").strip().lower() or "grammar"
    for dialect in SCHEMA_DIALECTS:
        if dialect == wanted:
            return dialect
    raise ConfigurationError(
        f"LLM_SCHEMA_DIALECT must be one of {', '.join(SCHEMA_DIALECTS)}, not {value!r}")


def _sandbox(value: str) -> str:
    if value.lower() not in ("off", "strict"):
        raise ConfigurationError(
            f"TURNSTILE_WORKFLOW_SANDBOX must be 'off' or 'strict', not {value!r}")
    return value.lower()


def _budget(value: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        budget = int(value.strip().replace("_", "").replace(",", ""))
    except ValueError:
        budget = -1
    if budget < 0:
        raise ConfigurationError(
            f"TURNSTILE_DAILY_TOKEN_BUDGET must be a whole number of tokens (0 or more), "
            f"not {value!r}")
    return budget


def _seconds(name: str, value: str | None, default: float) -> float:
    """A positive number of seconds (unset or blank: `default`)."""
    if value is None or not value.strip():
        return default
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigurationError(f"{name} must be a positive number of seconds, not {value!r}")
    return seconds
