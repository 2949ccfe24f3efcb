"""`python worker.py --processes N` (turnstile.runtime.worker_processes): N worker
processes poll the task queue, turns complete on them, the e-mail sender runs
in exactly one (each mail delivered once), a child that dies is restarted,
SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from tests.support.processes import free_port
from tests.support.temporal_server import DevServer
from tests.support.turns import wait_pending
from tests.support.waiting import wait_until
from tests.support.worker_process import WorkerProcess
from turnstile.engine.contract import (
    WORKFLOW_TYPE,
    ApproveSignal,
    TurnInput,
    TurnResult,
    TurnStatus,
)
from turnstile.runtime.worker_processes import Supervisor, child_args, processes_from_env
from turnstile.sales.smtp_server import LocalSmtpServer, read_mailbox
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

TURNS = 4


def test_children_get_the_arguments_without_processes_and_one_sender() -> None:
    args = ["--processes", "3", "-v"]
    assert child_args(args, 0) == ["-v"]
    assert child_args(args, 1) == ["-v", "--no-sender"]
    assert child_args(["--processes=2", "--no-sender"], 0) == ["--no-sender"]
    assert child_args(["--no-sender", "--processes", "2"], 1) == ["--no-sender"]


def test_processes_from_the_environment() -> None:
    assert processes_from_env({}) == (os.cpu_count() or 1)
    assert processes_from_env({"TURNSTILE_WORKER_PROCESSES": "3"}) == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match="TURNSTILE_WORKER_PROCESSES"):
            processes_from_env({"TURNSTILE_WORKER_PROCESSES": bad})


def children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


async def poller_pids(client: Client, queue: str) -> set[int]:
    """The processes polling the queue's workflow tasks (identity `pid@host`)."""
    resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
    return {int(p.identity.split("@", 1)[0]) for p in resp.pollers}


def mail_model(request: dict[str, Any]) -> object:
    """One createEmailTask per turn, its subject the user's "mail number N"."""
    if request["messages"][-1]["role"] == "tool":
        return text_reply("queued")
    found = re.search(r"mail number \d+", request["messages"][-1]["content"])
    assert found is not None
    return tool_reply((f"e-{uuid.uuid4().hex[:6]}", "createEmailTask",
                       {"to": "ops@example.com", "subject": found[0], "body": "C0001"}))


async def test_two_processes_poll_complete_turns_and_mail_once(
        temporal_server: DevServer, client: Client, tmp_path: Path,
        fake_llm: FakeOpenAIServer) -> None:
    queue = f"procs-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "TURNSTILE_TASK_QUEUE": queue,
           "DATABASE_URL": f"sqlite:///{tmp_path}/t.db", "LLM_BASE_URL": fake_llm.url,
           "TURNSTILE_DATA_DIR": str(tmp_path / "data"), "SMTP_HOST": "127.0.0.1",
           "SMTP_PORT": str(port)}
    fake_llm.default = mail_model
    log = tmp_path / "worker.log"
    with LocalSmtpServer(tmp_path / "mail", port=port):
        sup = WorkerProcess(log, env, args=("--processes", "2"),
                            ready_marker=b"all 2 worker processes serving task queue").start()
        assert sup.proc is not None
        try:
            kids = children(sup.proc.pid)
            assert len(kids) == 2
            async def both_poll() -> bool:
                return await poller_pids(client, queue) == kids

            await wait_until(both_poll, what="both processes polling", timeout=30)
            assert log.read_text().count("e-mail sender running") == 1

            handles = [await client.start_workflow(
                WORKFLOW_TYPE, TurnInput(conversation_id=f"c-{i}-{uuid.uuid4().hex[:6]}",
                                         user_id="alice", message=f"mail number {i}",
                                         service="sales-assistant"),
                id=f"procs-{uuid.uuid4().hex[:8]}", task_queue=queue, result_type=TurnResult)
                for i in range(TURNS)]
            for h in handles:
                [pending] = await wait_pending(h)
                await h.signal("approve", ApproveSignal(tool_call_id=pending.tool_call_id,
                                                        reviewer="carol"))
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 90)
            assert all(r.status == TurnStatus.COMPLETED for r in results), results
            await wait_until(lambda: len(read_mailbox(tmp_path / "mail")) >= TURNS,
                             what="every mail", timeout=60)

            # A child killed (a crash) is restarted; the sender still runs once.
            victim, pid = max(kids), sup.proc.pid
            os.kill(victim, signal.SIGKILL)
            await wait_until(lambda: log.read_text().count(") serving") >= 3,
                             what="the restarted child serving", timeout=60)
            now = children(pid)
            assert len(now) == 2 and victim not in now
            assert "restarting it in" in log.read_text()
            assert log.read_text().count("e-mail sender running") == 1
            kids = children(sup.proc.pid)
        finally:
            sup.proc.send_signal(signal.SIGTERM)  # the supervisor only: it forwards
            status = await asyncio.to_thread(sup.proc.wait, 60)
        mails = read_mailbox(tmp_path / "mail")
    assert status == 0
    assert not any(Path(f"/proc/{k}").exists() for k in kids)  # both stopped with it
    subjects = sorted(m["Subject"] for m in mails)
    assert subjects == sorted(f"mail number {i}" for i in range(TURNS))  # each once


CHILD = r"""
import os, signal, sys, time
index = os.environ["TURNSTILE_WORKER_INDEX"]
with open(sys.argv[1], "a") as f:
    f.write(f"{index} {os.getpid()} {' '.join(sys.argv[2:])}\n")
if sys.argv[2:3] == ["fatal"]:
    sys.exit(3)
starts = [line for line in open(sys.argv[1]) if line.startswith(index + " ")]
if index == "1" and len(starts) == 1:
    sys.exit(1)  # the first start of process 1 dies: the supervisor restarts it
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
fd = int(os.environ["TURNSTILE_READY_FD"])
os.write(fd, b"r")
os.close(fd)
while True:
    time.sleep(1)
"""


async def test_a_child_that_dies_is_restarted_and_sigterm_stops_all(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    sup = Supervisor(2, [sys.executable, "-c", CHILD, str(starts)], ["--processes", "2"],
                     grace_seconds=5)
    running = asyncio.ensure_future(sup.run())

    def lines() -> list[list[str]]:
        return [ln.split() for ln in starts.read_text().splitlines()] if starts.exists() else []

    await wait_until(lambda: len([ln for ln in lines() if ln[0] == "1"]) == 2
                     and all(s.ready.is_set() for s in sup.slots),
                     what="process 1 restarted and both ready", timeout=30)
    first = [ln for ln in lines() if ln[0] == "0"]
    others = [ln for ln in lines() if ln[0] == "1"]
    assert len(first) == 1 and first[0][2:] == []  # the first: the sender's, no --no-sender
    assert all(ln[2:] == ["--no-sender"] for ln in others)
    sup.stop(signal.SIGTERM)
    assert await asyncio.wait_for(running, 20) == 0
    for _, pid, *_ in lines():
        assert not Path(f"/proc/{pid}").exists()  # stopped and reaped


async def test_a_status_no_restart_can_change_stops_the_group(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    sup = Supervisor(3, [sys.executable, "-c", CHILD, str(starts), "fatal"], [],
                     grace_seconds=5)
    assert await asyncio.wait_for(sup.run(), 20) == 3
    assert len(starts.read_text().splitlines()) == 1  # the others never started
