"""Writes of a run of a turn (turnstile.stores.runs): who is writing, and
the check with Temporal that only the workflow's current run takes an
earlier run's place in its conversation."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from turnstile.activities.runtime import turn_workflow_id
from turnstile.engine.errors import RunSuperseded
from turnstile.runtime.holders import holder_gone
from turnstile.stores.db import Database
from turnstile.stores.runs import RunUnconfirmed, Writer

log = logging.getLogger("turnstile.activities")

__all__ = ["as_current_run", "holder_gone", "run_is_current", "writer"]

T = TypeVar("T")


def writer(chain: str) -> Writer:
    """The run this activity belongs to, as a writer of its turn's memory."""
    return Writer(turn_workflow_id(), chain, activity.info().workflow_run_id or "")


async def run_is_current(client: Client, workflow_id: str, run_id: str) -> bool:
    """Is this run running (so the workflow's current run)? A run a reset
    replaced is terminated; its activities may still be finishing."""
    try:
        desc = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return desc.status == WorkflowExecutionStatus.RUNNING


async def as_current_run(db: Database, chain: str, write: Callable[[Writer], T]) -> T:
    """Run the store call `write` (`db.call`) as this activity's run; if it
    would take an earlier run's place, confirm with Temporal first and run it
    again confirmed. Raises RunSuperseded when this run is not current."""
    w = writer(chain)
    try:
        return await db.call(write, w)
    except RunUnconfirmed:
        if not await run_is_current(activity.client(), w.workflow_id, w.run_id):
            raise RunSuperseded(
                f"run {w.run_id} of turn {w.workflow_id} is no longer its workflow's current "
                "run (reset or ended); its writes to the conversation are refused") from None
        log.info("run %s of %s takes its turn's place in the conversation", w.run_id,
                 w.workflow_id)
        return await db.call(write, replace(w, confirmed=True))
