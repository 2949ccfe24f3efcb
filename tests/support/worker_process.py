"""`python worker.py` as a real subprocess, for tests that kill it."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tests.support.processes import kill_group, spawn, wait_for
from tests.support.worker_env import WORKER_ENV

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    def __init__(self, log: Path, env: dict[str, str], args: tuple[str, ...] = ("--no-sender",),
                 ready_marker: bytes = b"worker serving task queue", root: Path = ROOT):
        """`root`: the checkout whose worker runs (another release's, for upgrade tests)."""
        self.log, self.env, self.args, self.marker = log, env, args, ready_marker
        self.root = root
        self.proc = None

    def start(self) -> WorkerProcess:
        offset = self.log.stat().st_size if self.log.exists() else 0
        # The tests' worker settings (tests/support/worker_env.py), unless the test sets its own.
        full_env = {**os.environ, **WORKER_ENV, **self.env,
                    "PYTHONPATH": str(self.root),
                    "TURNSTILE_PLUGINS": "tests.support.services:register"}
        self.proc = spawn([sys.executable, str(self.root / "worker.py"), *self.args], self.log,
                          env=full_env, cwd=self.root)

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log.read_text()[-2000:]}")
            with open(self.log, "rb") as f:
                f.seek(offset)
                return self.marker in f.read()

        wait_for(ready, 60, "worker process")
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, no activity completion, exactly like a lost machine."""
        if self.proc is not None:
            kill_group(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc, signal.SIGTERM)
