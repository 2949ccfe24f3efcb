"""Processes and history figures for bench/turns.py: the dev server, worker
processes (with their CPU time), the whole stack of a bench run (database,
dev server, model server, client), percentiles and per-turn history size."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from turnstile.runtime.devstack import temporal_dev_command
from turnstile.sales.seed import seed
from turnstile.stores.db import Database
from turnstile.testing import FakeOpenAIServer

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LOCAL_ACTIVITY_MARKER = "core_local_activity"
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def threads_cpu_seconds(pid: int) -> dict[str, float]:
    """User CPU time of a process's threads, summed by OS thread name with
    digits dropped, and their kernel time as "NAME (system)", from
    /proc/PID/task: how much went to the SDK's Rust core (`tokio-rt-worker`),
    its workflow thread and Python's threads (`python`: CPython 3.11 does not
    name its threads for the OS, so the event loop, the database threads and
    exporters are one group)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        name = "".join(c for c in comm if not c.isdigit()).rstrip("-_") or comm
        for key, ticks in ((name, fields[11]), (f"{name} (system)", fields[12])):
            out[key] = out.get(key, 0.0) + int(ticks) / CLOCK_TICKS
    return out


def _stop_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class DevServer:
    """`temporal server start-dev` (in memory, speed flags) in its own process group."""

    def __init__(self, logfile: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        with open(logfile, "ab") as out:
            extra = os.environ.get("BENCH_SERVER_FLAGS", "").split()  # e.g. a dynamic config
            self.proc = subprocess.Popen([*temporal_dev_command(self.port, 0, None, headless=True),
                                          *extra],
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def stop(self) -> None:
        _stop_group(self.proc, 10)

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)


class WorkerProc:
    """A worker process in its own process group, ready once `ready` is logged."""

    def __init__(self, command: list[str], env: dict[str, str], logfile: Path, ready: str,
                 cwd: Path, timeout: float = 120) -> None:
        self.logfile = logfile
        with open(logfile, "ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **env}, cwd=cwd,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while ready not in logfile.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"worker {command} did not start: "
                                   f"{logfile.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the worker process (all its threads)."""
        return process_cpu_seconds(self.proc.pid)

    def stop(self, timeout: float = 30) -> None:
        _stop_group(self.proc, timeout)

    def stop_child(self, timeout: float = 60) -> None:
        """SIGTERM the process's children only (the worker under `py-spy record`,
        which writes its profile when the worker exits), then wait for it."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        for pid in children.split():
            os.kill(int(pid), signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()


async def connect(address: str, timeout: float = 60) -> Client:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client = await Client.connect(address, data_converter=pydantic_data_converter)
            await client.count_workflows()
            return client
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@asynccontextmanager
async def bench_stack(workdir: Path, rows: int, reply: Callable[[dict[str, Any]], dict[str, Any]],
                      ) -> AsyncIterator[tuple[Client, DevServer, dict[str, str]]]:
    """A SQLite database seeded with `rows` sales rows (as `starter.py seed`), a
    dev server, a model server answering every request with `reply`, and a
    client: yields the client, the server and the environment of the workers;
    checks at the end that the model refused nothing."""
    db_url = f"sqlite:///{workdir / 'bench.db'}"
    seed(Database(db_url), rows=rows)
    server = DevServer(workdir / "temporal.log")
    fake = FakeOpenAIServer(keep_alive=True)  # persistent connections, as real endpoints
    fake.default = reply
    # The bench's model stands for a hosted endpoint, which takes `"content":
    # null` beside tool calls (pydantic-ai sends it); the fake refuses it by
    # default, as llama-cpp-python does.
    fake.null_content_refused = False
    try:
        client = await connect(server.address)
        yield client, server, {
            "TEMPORAL_ADDRESS": server.address, "DATABASE_URL": db_url,
            "LLM_BASE_URL": fake.url, "BENCH_LLM_URL": fake.url,
            "TURNSTILE_DATA_DIR": str(workdir), "PYTHONPATH": str(ROOT)}
        if fake.refusals:
            raise RuntimeError(f"the model refused requests: {fake.refusals[:3]}")
    finally:
        fake.close()
        server.stop()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _is_activity(e: HistoryEvent) -> bool:
    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return True
    return (e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and e.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER)


async def history_stats(client: Client, ids: list[str]) -> tuple[float, float, float]:
    """Mean activities (including local ones), events and bytes per workflow history."""
    acts = events = size = 0
    for wf_id in ids:
        history = await client.get_workflow_handle(wf_id).fetch_history()
        events += len(history.events)
        size += sum(e.ByteSize() for e in history.events)
        acts += sum(1 for e in history.events if _is_activity(e))
    n = len(ids)
    return acts / n, events / n, size / n


async def activity_types(client: Client, wf_id: str) -> dict[str, int]:
    """Activities (and local activities, as `local`) one workflow scheduled, by type."""
    history = await client.get_workflow_handle(wf_id).fetch_history()
    counts: dict[str, int] = {}
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
        elif _is_activity(e):
            name = "local"
        else:
            continue
        counts[name] = counts.get(name, 0) + 1
    return counts
