"""Several worker processes on one host: `python worker.py --processes N`.

One Python process runs on one core at a time (the GIL), and a Turnstile
worker is CPU-bound under load (bench/README.md), so a host with spare cores
runs more of them. The supervisor here starts N ordinary worker processes
(`worker.py` with the same arguments, without `--processes`) and:

- **one e-mail sender.** The first process (index 0) runs the sender loop as
  a single `worker.py` does (unless `--no-sender`); the others get
  `--no-sender`. A restarted first process is again the one sender; it never
  overlaps with itself, since it is restarted only after it exited.
- **migrations once.** The first process starts alone and migrates the schema;
  the others start once it reports it serves the task queue.
- **signals forwarded.** SIGTERM / SIGINT reach every child (each then shuts
  down as a single worker does: running activities get
  TURNSTILE_SHUTDOWN_GRACE_SECONDS); the supervisor exits when all have,
  SIGKILLing any still running `grace + 30` s later.
- **a child that dies is restarted**, after 1 s, doubling to 30 s while it
  keeps dying within a minute of its start; its exit is logged with its
  status. Statuses a restart cannot change stop the whole group, with that
  status: 2 (bad arguments) and 3 (turns of an older version run:
  turnstile.runtime.upgrade).

Readiness: each child writes a byte to a pipe the supervisor gives it
(TURNSTILE_READY_FD) once it serves the task queue (`report_ready`); the
supervisor logs "all N worker processes serving task queue" when every child
has. TURNSTILE_WORKER_INDEX tells a child its index.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

log = logging.getLogger("turnstile.processes")

READY_FD = "TURNSTILE_READY_FD"
WORKER_INDEX = "TURNSTILE_WORKER_INDEX"
PROCESSES_ENV = "TURNSTILE_WORKER_PROCESSES"
# Exit statuses a restart cannot change (argparse's usage error; worker.py's
# EXIT_OLDER_TURNS): the group stops with it.
FATAL = frozenset({2, 3})
FIRST_DELAY, MAX_DELAY, STEADY_SECONDS = 1.0, 30.0, 60.0


def processes_from_env(env: dict[str, str] | None = None) -> int:
    """How many worker processes `make up` starts: TURNSTILE_WORKER_PROCESSES,
    default the number of cores (os.cpu_count(), 1 when unknown)."""
    value = (os.environ if env is None else env).get(PROCESSES_ENV, "").strip()
    if not value:
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{PROCESSES_ENV} must be a whole number of at least 1, not {value!r}")
    return n


def child_args(args: Sequence[str], index: int) -> list[str]:
    """A child's arguments: the supervisor's without `--processes N`; every
    child but the first also gets `--no-sender`."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--processes":
            skip = True
        elif not a.startswith("--processes="):
            out.append(a)
    if index > 0 and "--no-sender" not in out:
        out.append("--no-sender")
    return out


def report_ready() -> None:
    """Called by a worker once it serves its task queue: tells the supervisor
    (a no-op for a worker not started by one)."""
    fd = os.environ.pop(READY_FD, None)
    if not fd:
        return
    try:
        os.write(int(fd), b"r")
        os.close(int(fd))
    except (OSError, ValueError) as exc:  # the supervisor went away: nothing to tell
        log.warning("could not report readiness to the supervisor: %s", exc)


@dataclass
class _Slot:
    index: int
    proc: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    restarts: int = 0


class Supervisor:
    def __init__(self, n: int, command: Sequence[str], args: Sequence[str],
                 grace_seconds: float) -> None:
        if n < 1:
            raise ValueError(f"--processes must be at least 1, not {n}")
        self.command, self.args, self.grace = list(command), list(args), grace_seconds
        self.slots = [_Slot(i) for i in range(n)]
        self.stopping = asyncio.Event()
        self.status = 0
        self._all_ready_said = False

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop, sig)
        log.info("supervising %d worker processes (pid %d); the first runs the e-mail sender%s",
                 len(self.slots), os.getpid(),
                 " (--no-sender: none does)" if "--no-sender" in self.args else "")
        await asyncio.gather(*(self._keep(s) for s in self.slots))
        return self.status

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Forward `sig` to every child and restart none (the gather in run()
        ends once they all exited); SIGKILL after the grace."""
        first = not self.stopping.is_set()
        self.stopping.set()
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                try:
                    slot.proc.send_signal(sig)
                except ProcessLookupError:
                    pass
        if first:
            asyncio.get_running_loop().call_later(self.grace + 30, self._kill_all)

    def _kill_all(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                log.warning("worker process %d (pid %d) still running %.0f s after the "
                            "signal: killed", slot.index, slot.proc.pid, self.grace + 30)
                slot.proc.kill()

    async def _until_stopping(self, aw: asyncio.Event, timeout: float | None = None) -> None:
        """Wait for `aw` (or `timeout`), or until the group stops."""
        waits = {asyncio.ensure_future(aw.wait()), asyncio.ensure_future(self.stopping.wait())}
        _, pending = await asyncio.wait(waits, timeout=timeout,
                                        return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()

    async def _keep(self, slot: _Slot) -> None:
        """Run the slot's child until the group stops, restarting it when it dies."""
        delay = FIRST_DELAY
        while not self.stopping.is_set():
            if slot.index > 0:  # after the first has migrated and serves
                await self._until_stopping(self.slots[0].ready)
                if self.stopping.is_set():
                    return
            began = time.monotonic()
            code = await self._run_child(slot)
            if self.stopping.is_set():
                return
            if code in FATAL:
                log.error("worker process %d exited with status %d, which a restart cannot "
                          "change: stopping all", slot.index, code)
                self.status = code
                self.stop()
                return
            delay = FIRST_DELAY if time.monotonic() - began > STEADY_SECONDS \
                else min(delay * 2, MAX_DELAY) if slot.restarts else FIRST_DELAY
            slot.restarts += 1
            log.error("worker process %d exited with status %s; restarting it in %.0f s "
                      "(restart %d)", slot.index, code, delay, slot.restarts)
            await self._until_stopping(asyncio.Event(), timeout=delay)

    async def _run_child(self, slot: _Slot) -> int:
        read_end, write_end = os.pipe()
        slot.ready.clear()
        env = {**os.environ, READY_FD: str(write_end), WORKER_INDEX: str(slot.index)}
        try:
            slot.proc = await asyncio.create_subprocess_exec(
                *self.command, *child_args(self.args, slot.index), env=env,
                pass_fds=(write_end,))
        finally:
            os.close(write_end)
        log.info("worker process %d started (pid %d)%s", slot.index, slot.proc.pid,
                 ", with the e-mail sender" if slot.index == 0
                 and "--no-sender" not in self.args else "")
        loop, pid = asyncio.get_running_loop(), slot.proc.pid
        open_fd = [read_end]  # closed once, by whichever comes first

        def close() -> None:
            if open_fd:
                loop.remove_reader(open_fd[0])
                os.close(open_fd.pop())

        def readable() -> None:
            said = os.read(read_end, 1)
            close()
            if said:  # b"": the child exited without reporting
                slot.ready.set()
                log.info("worker process %d (pid %d) serving", slot.index, pid)
                self._say_all_ready()

        loop.add_reader(read_end, readable)
        code = await slot.proc.wait()
        close()
        slot.ready.clear()
        return code

    def _say_all_ready(self) -> None:
        if not self._all_ready_said and all(s.ready.is_set() for s in self.slots):
            self._all_ready_said = True
            log.info("all %d worker processes serving task queue", len(self.slots))


async def supervise(n: int, command: Sequence[str], args: Sequence[str],
                    grace_seconds: float) -> int:
    """Run `command + args` as n supervised worker processes until SIGTERM /
    SIGINT; returns the exit status (0, or a FATAL status of a child)."""
    return await Supervisor(n, command, args, grace_seconds).run()
