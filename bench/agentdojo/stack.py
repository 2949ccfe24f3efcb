"""Where the bench's turns run: a Temporal dev server and a worker.

`InProcess`: turnstile.testing.TestStack (the worker in this process).
`ChildWorker`: the same dev server and database, the worker as a child
process (`python -m turnstile worker --app bench.agentdojo.app:app`), so
`kill()` can SIGKILL it — no shutdown, no activity completion, as a lost
machine — and `restart()` starts a new one on the same task queue.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.agentdojo import app as apps
from turnstile import App, Database, Settings, TurnstileClient
from turnstile.runtime.client import connect
from turnstile.testing import TestStack
from turnstile.testing.processes import DevServer, free_port, kill_group, spawn, wait_for

ROOT = Path(__file__).resolve().parents[2]
READY = b"worker serving task queue"


class InProcess:
    def __init__(self, data_dir: Path, app: str | App = "app",
                 temporal_address: str | None = None, sandbox: bool = True) -> None:
        built = getattr(apps, app)() if isinstance(app, str) else app
        self._stack = TestStack([built], data_dir,
                                temporal_address=temporal_address, sandbox=sandbox)
        self.client: TurnstileClient
        self.db: Database

    async def __aenter__(self) -> InProcess:
        await self._stack.__aenter__()
        assert self._stack.client is not None
        self.client, self.db = self._stack.client, self._stack.db
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stack.__aexit__(kind, exc, tb)


class ChildWorker:
    def __init__(self, data_dir: Path, app: str = "app") -> None:
        self.app = f"bench.agentdojo.app:{app}"
        self.data_dir = data_dir
        self.log = data_dir / "worker.log"
        self.env: dict[str, str] = {}
        self._server: DevServer | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.client: TurnstileClient
        self.db: Database
        self.kills = 0

    async def __aenter__(self) -> ChildWorker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = await asyncio.to_thread(DevServer, free_port(),
                                               self.data_dir / "temporal.log")
        self.env = {
            "TEMPORAL_ADDRESS": self._server.address,
            "DATABASE_URL": f"sqlite:///{self.data_dir / 'turnstile.db'}",
            "TURNSTILE_DATA_DIR": str(self.data_dir),
            "TURNSTILE_TASK_QUEUE": f"dojo-{uuid.uuid4().hex[:10]}",
            "TURNSTILE_WORKER_VERSIONING": "off",
            "TURNSTILE_UPGRADE_CHECK": "off",
            "TURNSTILE_WORKFLOW_SANDBOX": "strict",
        }
        await asyncio.to_thread(self._start)
        settings = Settings.from_env(self.env)
        self.db = Database(settings.database_url)
        self.client = TurnstileClient(await connect(settings), settings)
        return self

    def _start(self) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        env = {**os.environ, **self.env, "PYTHONPATH": str(ROOT)}
        env.pop("LLM_BASE_URL", None)  # the oracles answer, never a model server
        self._proc = spawn([sys.executable, "-m", "turnstile", "worker", "--no-sender",
                            "--app", self.app], self.log, env=env)
        proc = self._proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log.read_text()[-2000:]}")
            with open(self.log, "rb") as f:
                f.seek(offset)
                return READY in f.read()

        wait_for(ready, 120, "the bench's worker")

    async def kill_and_restart(self) -> None:
        if self._proc is not None:
            kill_group(self._proc, signal.SIGKILL)
            self.kills += 1
        await asyncio.to_thread(self._start)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._proc is not None:
            kill_group(self._proc, signal.SIGTERM)
        if self._server is not None:
            self._server.stop()

    def check_env(self) -> dict[str, Any]:
        """The environment `turnstile check` reads for this stack."""
        return {**os.environ, **self.env, "PYTHONPATH": str(ROOT)}
