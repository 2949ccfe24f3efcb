"""Asking many turns for their pending approvals at once, for
`TurnstileClient.approvals` (the inbox's list): each turn's query isolated,
bounded and remembered.

- **Isolated:** a turn whose query fails, or does not answer within the
  timeout (its build's workers are gone), gives the reason instead of its
  calls; the others answer.
- **Bounded:** at most `IN_FLIGHT` queries at once (a worker answers them one
  activation at a time: more in flight only makes each wait longer), each
  within `query_timeout` once sent.
- **Remembered:** a turn's answer is kept with its run id and its count of
  pending calls (the `TurnstilePendingApprovals` search attribute, upserted
  at every transition that changes them: workflows/state.py, `publish`).
  While the count is the same, the kept answer is shown at once; once it is
  older than `FRESH_SECONDS` it is asked again in the background, for the
  next listing. So a listing waits only for turns it has not seen with this
  count. A turn that, between two listings, had its call decided elsewhere
  and parked on a new one with the same count shows the old call for at most
  `FRESH_SECONDS` and one query more (visibility itself lags a transition
  by a moment); a call's own page and every decision ask the turn itself,
  and `forget` drops what is kept of a turn this client just decided.
- **Not waited for twice:** a turn that did not answer in time is shown as
  unanswered at once for `SILENT_RETRY_SECONDS`, then asked again in the
  background.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecution, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from turnstile.engine import search_keys
from turnstile.engine.contract import Handlers, PendingApproval
from turnstile.runtime.client import workflow_gone

log = logging.getLogger(__name__)

# How long one turn's `pending_approvals` query may take in a listing.
QUERY_TIMEOUT = timedelta(seconds=0.8)
SILENT_RETRY_SECONDS = 30.0
FRESH_SECONDS = 5.0
IN_FLIGHT = 16
PENDING_COUNT = search_keys.PENDING_APPROVALS

Answer = list[PendingApproval] | str  # the calls, or why the turn did not say
Key = tuple[str, str]  # (workflow id, run id)


class ApprovalsListing:
    def __init__(self, client: Client, query_timeout: timedelta = QUERY_TIMEOUT) -> None:
        self.client, self.timeout = client, query_timeout
        # key -> (pending count it was asked at, when, the answer)
        self._kept: dict[Key, tuple[int, float, list[PendingApproval]]] = {}
        self._silent: dict[Key, tuple[float, str]] = {}
        self._probes: set[asyncio.Task[Any]] = set()
        self._asking: set[Key] = set()
        self._gate = asyncio.Semaphore(IN_FLIGHT)
        self.queries_sent = 0  # for benchmarks: how many turns were asked

    async def answers(self, turns: Sequence[WorkflowExecution], complete: bool) -> list[Answer]:
        """One answer per turn, in order. `complete`: `turns` are all the
        turns that wait (unfiltered), so what is kept of others is dropped."""
        if complete:
            live = {(wf.id, wf.run_id or "") for wf in turns}
            for gone in set(self._kept) - live:
                del self._kept[gone]
            for gone in set(self._silent) - live:
                del self._silent[gone]
        return list(await asyncio.gather(*(self._answer(wf) for wf in turns)))

    def forget(self, workflow_id: str) -> None:
        """Drop what is kept of a turn (this client just decided one of its calls)."""
        for key in [k for k in self._kept if k[0] == workflow_id]:
            del self._kept[key]

    async def _answer(self, wf: WorkflowExecution) -> Answer:
        key = (wf.id, wf.run_id or "")
        count = wf.typed_search_attributes.get(PENDING_COUNT)
        kept = self._kept.get(key)
        if kept is not None and kept[0] == count:
            if time.monotonic() - kept[1] >= FRESH_SECONDS:
                self._in_background(key, wf)
            return kept[2]
        silent = self._silent.get(key)
        if silent is None:
            return await self._ask(wf)
        since, reason = silent
        if time.monotonic() - since >= SILENT_RETRY_SECONDS:
            self._silent[key] = (time.monotonic(), reason)
            self._in_background(key, wf)
        return reason

    def _in_background(self, key: Key, wf: WorkflowExecution) -> None:
        if key in self._asking or len(self._probes) >= 4 * IN_FLIGHT:
            return
        self._asking.add(key)
        probe = asyncio.ensure_future(self._ask(wf))
        self._probes.add(probe)

        def done(task: asyncio.Task[Any]) -> None:
            self._probes.discard(task)
            self._asking.discard(key)

        probe.add_done_callback(done)

    async def _ask(self, wf: WorkflowExecution) -> Answer:
        """The turn's pending calls, or why it did not say (never raises)."""
        key = (wf.id, wf.run_id or "")
        seconds = self.timeout.total_seconds()
        late = f"did not answer within {seconds:g} s (are its build's workers running?)"
        async with self._gate:
            self.queries_sent += 1
            try:
                pending: list[PendingApproval] = await asyncio.wait_for(
                    self.client.get_workflow_handle(wf.id, run_id=wf.run_id).query(
                        Handlers.PENDING_APPROVALS, result_type=list[PendingApproval],
                        rpc_timeout=self.timeout), seconds)
            except TimeoutError:
                self._silent[key] = (time.monotonic(), late)
                return late
            except WorkflowQueryFailedError as err:
                log.warning("pending_approvals of %s failed: %s", wf.id, err)
                return f"its query failed: {err}"
            except RPCError as err:
                if workflow_gone(err):
                    return []  # it ended meanwhile
                if (err.status == RPCStatusCode.DEADLINE_EXCEEDED
                        or "timeout" in err.message.lower()):  # the rpc_timeout expired
                    self._silent[key] = (time.monotonic(), late)
                    return late
                return f"did not answer: {err.message}"
        self._silent.pop(key, None)
        count = wf.typed_search_attributes.get(PENDING_COUNT)
        if count is not None:
            self._kept[key] = (count, time.monotonic(), pending)
        return pending
