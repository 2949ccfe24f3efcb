"""docker-compose.yml, Dockerfile and deploy/ agree with the code (no Docker needed).

Checked statically: images and dependencies exist, every Turnstile command is
one the real argument parsers accept, every environment variable set on a
Turnstile service is one the code reads, health checks, mounted files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
CODE = [ROOT / "worker.py", ROOT / "starter.py", ROOT / "turnstile", ROOT / "activities",
        ROOT / "workflows"]
CORE_ENV = {"TEMPORAL_ADDRESS", "DATABASE_URL", "TURNSTILE_TASK_QUEUE"}

# `e.get("NAME")`, `os.environ.get("NAME")`, `os.environ["NAME"]`, `os.getenv("NAME")`
_ENV_READ = re.compile(
    r"""(?:\benviron|\bgetenv|\be)\s*(?:\.get\s*\(|\[|\()\s*["']([A-Z][A-Z0-9_]+)["']""")
_OTEL_LITERAL = re.compile(r"""["'](OTEL_[A-Z0-9_]+)["']""")


def _python_sources() -> Iterator[Path]:
    for entry in CODE:
        yield from ([entry] if entry.is_file() else sorted(entry.rglob("*.py")))


def env_vars_read_by_code() -> set[str]:
    names: set[str] = set()
    for path in _python_sources():
        text = path.read_text()
        names |= set(_ENV_READ.findall(text)) | set(_OTEL_LITERAL.findall(text))
    return names


def temporal_envconfig_vars() -> set[str]:
    """The variables Temporal's environment configuration reads (temporalio.envconfig,
    through turnstile.runtime.config): the same as the `temporal` CLI's."""
    from turnstile.runtime.config import TEMPORAL_ENV

    return set(TEMPORAL_ENV)


def standard_otel_vars() -> set[str]:
    import opentelemetry.sdk.environment_variables as otel_env

    return {v for k, v in vars(otel_env).items() if k.startswith("OTEL_") and isinstance(v, str)}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def is_turnstile(svc: dict[str, Any]) -> bool:
    return "build" in svc or str(svc.get("image", "")).startswith("turnstile")


def turnstile_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if is_turnstile(s)}


def command_of(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command")
    if cmd is None:
        return ["python", "worker.py"]  # the Dockerfile's CMD
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def environment_of(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def depends_on(svc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    deps = svc.get("depends_on") or {}
    return {d: {} for d in deps} if isinstance(deps, list) else deps


def runs_worker(svc: dict[str, Any]) -> bool:
    return command_of(svc)[1:2] == ["worker.py"]


# --- structure -------------------------------------------------------------------

def test_every_service_has_an_image_or_a_build(services: dict[str, dict[str, Any]]) -> None:
    assert services
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), name


def test_every_dependency_is_a_service(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for dep in depends_on(svc):
            assert dep in services, f"{name} depends on unknown service {dep!r}"


def test_no_auto_setup_image() -> None:
    assert "auto-setup" not in COMPOSE.read_text()


def test_temporal_schema_by_admin_tools_before_the_server(
        services: dict[str, dict[str, Any]]) -> None:
    servers = [n for n, s in services.items() if str(s.get("image", "")).startswith(
        "temporalio/server:")]
    assert len(servers) == 1
    server = services[servers[0]]
    setup = [d for d, cond in depends_on(server).items()
             if cond.get("condition") == "service_completed_successfully"]
    assert setup, "the server must wait for a one-shot schema setup"
    assert all(str(services[d]["image"]).startswith("temporalio/admin-tools:") for d in setup)
    assert any(str(s.get("image", "")).startswith("temporalio/ui:") for s in services.values())


def test_health_checks(services: dict[str, dict[str, Any]]) -> None:
    pg = next(s for s in services.values() if str(s.get("image", "")).startswith("postgres:"))
    assert "pg_isready" in " ".join(map(str, pg["healthcheck"]["test"]))
    for name, svc in services.items():
        image = str(svc.get("image", ""))
        if image.startswith(("temporalio/server:", "temporalio/ui:")):
            assert svc.get("healthcheck", {}).get("test"), name
        for dep, cond in depends_on(svc).items():
            if cond.get("condition") == "service_healthy":
                assert services[dep].get("healthcheck"), f"{name} waits on {dep}'s health"


def test_workers_scale_and_split(services: dict[str, dict[str, Any]]) -> None:
    ours = turnstile_services(services)
    commands = {n: command_of(s) for n, s in ours.items()}
    workers = [n for n, c in commands.items() if c[1:] == ["worker.py", "--no-sender"]]
    senders = [n for n, c in commands.items() if c[1:] == ["worker.py", "--sender-only"]]
    assert workers and senders
    for n in workers:
        assert services[n]["deploy"]["replicas"] >= 2
        assert "container_name" not in services[n]  # would break replicas
        assert not services[n].get("ports")
    assert any("turnstile.sales.smtp_server" in c for c in commands.values())


def test_published_host_ports_are_distinct(services: dict[str, dict[str, Any]]) -> None:
    seen: dict[str, str] = {}
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            host = str(port).rsplit(":", 1)[0]
            assert host not in seen, f"{name} and {seen.get(host)} both publish {host}"
            seen[host] = name


# --- commands against the real parsers ----------------------------------------------

class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
        super().__init__("parsed")
        self.namespace, self.parser = namespace, parser


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and its subcommands (argparse would also
    accept unambiguous abbreviations; a compose file should spell them out)."""
    found: set[str] = set()
    for action in parser._actions:
        found |= set(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= option_strings(sub)
    return found


def parse_with_real_parser(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """Run the program's own entry point until its parser has accepted `argv`."""
    original = argparse.ArgumentParser.parse_args

    def stop_after_parsing(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        raise _Parsed(original(self, args, namespace), self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing)
    assert argv[0] == "python", argv
    try:
        if argv[1] == "worker.py":
            from turnstile.cli import worker

            asyncio.run(worker.run(argv[2:]))
        elif argv[1] == "starter.py":
            from turnstile.cli import starter

            asyncio.run(starter.main(argv[2:]))
        elif argv[1:3] == ["-m", "turnstile.sales.smtp_server"]:
            from turnstile.sales import smtp_server

            smtp_server.main(argv[3:])
        else:
            pytest.fail(f"not a Turnstile entry point: {argv}")
    except _Parsed as parsed:
        known = option_strings(parsed.parser)
        for token in argv:
            if token.startswith("--"):
                assert token.split("=", 1)[0] in known, f"{argv}: {token} is not spelled out"
        return parsed.namespace
    except SystemExit as exc:
        pytest.fail(f"{argv} rejected by its argument parser (exit {exc.code})")
    pytest.fail(f"{argv} never parsed its arguments")


def test_every_turnstile_command_is_accepted(services: dict[str, dict[str, Any]],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name, svc in turnstile_services(services).items():
        ns = parse_with_real_parser(command_of(svc), monkeypatch)
        assert ns is not None, name


def test_parser_check_rejects_unknown_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(pytest.fail.Exception):
        parse_with_real_parser(["python", "worker.py", "--no-such-flag"], monkeypatch)
    ns = parse_with_real_parser(["python", "worker.py", "--sender-only"], monkeypatch)
    assert ns.sender_only and not ns.no_sender


# --- environment --------------------------------------------------------------------

def test_scan_finds_the_documented_variables() -> None:
    found = env_vars_read_by_code() | temporal_envconfig_vars()
    documented = {"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TURNSTILE_TASK_QUEUE",
                  "DATABASE_URL", "LLM_BASE_URL", "LLM_API_KEY", "LLM_MODEL", "SMTP_HOST",
                  "SMTP_PORT", "TURNSTILE_AUDIT"}
    assert documented <= found, documented - found


def test_turnstile_services_set_only_variables_the_code_reads(
        services: dict[str, dict[str, Any]]) -> None:
    allowed = env_vars_read_by_code() | standard_otel_vars() | temporal_envconfig_vars()
    for name, svc in turnstile_services(services).items():
        unknown = set(environment_of(svc)) - allowed
        assert not unknown, f"{name} sets variables nothing reads: {sorted(unknown)}"


def test_workers_get_the_core_variables(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in turnstile_services(services).items():
        if not runs_worker(svc):
            continue
        env = environment_of(svc)
        assert CORE_ENV <= set(env), (name, CORE_ENV - set(env))
        assert env["TEMPORAL_ADDRESS"].split(":")[0] in services
        url = urlparse(env["DATABASE_URL"].replace("${", "").replace(":-", "-").replace("}", ""))
        assert url.scheme == "postgresql" and url.hostname in services, env["DATABASE_URL"]
        # Turnstile's data lives apart from Temporal's databases.
        assert url.path.strip("/") not in ("", "temporal", "temporal_visibility")
        for var in ("LLM_BASE_URL", "LLM_API_KEY", "LLM_MODEL"):
            assert env.get(var) == f"${{{var}:-}}", f"{name}: pass {var} through from the host"


# --- files --------------------------------------------------------------------------

def _host_path(source: str) -> Path | None:
    return ROOT / source if source.startswith((".", "/")) else None  # else a named volume


def test_mounted_and_built_files_exist(compose: dict[str, Any],
                                       services: dict[str, dict[str, Any]]) -> None:
    named = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for vol in svc.get("volumes") or []:
            source = vol["source"] if isinstance(vol, dict) else str(vol).split(":", 1)[0]
            path = _host_path(source)
            if path is None:
                assert source in named, f"{name}: undeclared volume {source!r}"
            else:
                assert path.exists(), f"{name} mounts missing {source}"
        for env_file in ([svc["env_file"]] if isinstance(svc.get("env_file"), str)
                         else svc.get("env_file") or []):
            assert (ROOT / env_file).exists(), env_file
        build = svc.get("build")
        if build:
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get(
                "dockerfile", "Dockerfile")
            assert (context / dockerfile).is_file()
    for cfg in (compose.get("configs") or {}).values():
        if "file" in cfg:
            assert (ROOT / cfg["file"]).exists(), cfg["file"]


def _setup_text(services: dict[str, dict[str, Any]]) -> str:
    """Commands of the admin-tools services and the scripts mounted into them."""
    parts = []
    for svc in services.values():
        if not str(svc.get("image", "")).startswith("temporalio/admin-tools:"):
            continue
        parts.append(" ".join(map(str, svc.get("command") or [])))
        for vol in svc.get("volumes") or []:
            path = _host_path(str(vol).split(":", 1)[0])
            if path and path.is_file():
                parts.append(path.read_text())
    return "\n".join(parts)


def test_setup_registers_turnstile_search_attributes(
        services: dict[str, dict[str, Any]]) -> None:
    from temporalio.api.enums.v1 import IndexedValueType

    from turnstile.runtime.search_attributes import ATTRIBUTES

    cli_type = {IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD: "Keyword",
                IndexedValueType.INDEXED_VALUE_TYPE_INT: "Int"}
    text = _setup_text(services)
    assert "search-attribute create" in text
    assert "temporal operator cluster health" in text
    assert "update-schema" in text
    for name, kind in ATTRIBUTES.items():
        assert f"{name}:{cli_type[kind]}" in text, name


def test_otel_collector_pipelines_are_wired() -> None:
    cfg = yaml.safe_load((ROOT / "deploy/otel/collector.yaml").read_text())
    for pipeline in cfg["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in cfg[kind], component


def test_temporal_dynamic_config_is_yaml() -> None:
    cfg = yaml.safe_load((ROOT / "deploy/temporal/dynamicconfig.yaml").read_text())
    for key, values in cfg.items():
        assert isinstance(values, list) and all("value" in v for v in values), key


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    # the package with every optional part the compose services use
    assert re.search(r"pip install -c constraints.txt '\.\[all\]'(\s|$)", text)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["all"] == ["turnstile[inbox,postgres,mcp]"]
    assert 'CMD ["python", "worker.py"]' in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".data"} <= set(ignored)


def test_the_collector_scrapes_every_worker_replica(services: dict[str, dict[str, Any]]) -> None:
    cfg = yaml.safe_load((ROOT / "deploy/otel/collector.yaml").read_text())
    jobs = {j["job_name"]: j for j in cfg["receivers"]["prometheus"]["config"]["scrape_configs"]}
    [sd] = jobs["turnstile-workers"]["dns_sd_configs"]
    worker = environment_of(services["worker"])
    assert sd["names"] == ["worker"] and sd["port"] == int(worker["TURNSTILE_METRICS_PORT"])
    assert worker["TURNSTILE_METRICS_HOST"] == "0.0.0.0"  # reachable from the collector


def test_the_dashboard_asks_only_for_series_the_code_records() -> None:
    """deploy/grafana/turnstile.json: every `turnstile_*` series it queries is
    created somewhere in the code (a histogram's `_bucket` is its own)."""
    dashboard = json.loads((ROOT / "deploy/grafana/turnstile.json").read_text())
    asked = {re.sub(r"_bucket$", "", name) for panel in dashboard["panels"]
             for target in panel["targets"]
             for name in re.findall(r"turnstile_[a-z_]+", target["expr"])}
    code = "\n".join(p.read_text() for p in _python_sources())
    recorded = set(re.findall(r'"(turnstile_[a-z_]+)"', code))
    assert asked and asked <= recorded, asked - recorded
