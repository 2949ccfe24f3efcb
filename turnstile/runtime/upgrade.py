"""The upgrade rule for turns in flight: a worker refuses to start while turns
of an older command-sequence version run (turnstile.engine.versions).

Why refuse rather than keep old code paths behind `workflow.patched`: the lean
turn (version 2) changed almost every command of a turn; keeping version 1
replayable would mean carrying the whole old pipeline in the workflow beside
the new one. Instead the upgrade is explicit: drain, then upgrade. A worker
of the new version that found an old turn could only fail its workflow tasks
with a nondeterminism error (retried until an old worker took them), so it
says so before it serves anything.

A turn's version is read from its history: the first activity its first
workflow task scheduled (`OPENINGS`). A turn whose first workflow task has
not completed yet has no version: any worker may run it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from turnstile.engine.contract import WORKFLOW_TYPE
from turnstile.engine.versions import OPENINGS, TURN_VERSION

log = logging.getLogger(__name__)

LOCAL_ACTIVITY_MARKER = "core_local_activity"
# Enough events for the first workflow task and its first commands.
OPENING_EVENTS = 24


def opening_activity(events: Iterable[HistoryEvent]) -> str | None:
    """The type of the first activity or local activity a history records."""
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            return e.activity_task_scheduled_event_attributes.activity_type.name
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            attrs = e.marker_recorded_event_attributes
            if attrs.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in attrs.details:
                continue
            data = attrs.details["data"].payloads
            if data:
                try:
                    kind = json.loads(data[0].data).get("activity_type")
                except ValueError:
                    continue
                if isinstance(kind, str):
                    return kind
    return None


def turn_version(events: Iterable[HistoryEvent]) -> int | None:
    """The command-sequence version of a turn's history (None: not known yet).
    An opening no version has is reported as version 0 (older than any)."""
    opening = opening_activity(events)
    if opening is None:
        return None
    return OPENINGS.get(opening, 0)


@dataclass(frozen=True)
class OlderTurn:
    workflow_id: str
    run_id: str
    version: int


async def older_turns(client: Client, limit: int = 1000,
                      unversioned_only: bool = False) -> list[OlderTurn]:
    """Running AgentTurn workflows of the namespace whose version is older than
    this code's (at most `limit` are examined). `unversioned_only`: skip turns
    pinned to a Worker Deployment Version — their own build finishes them
    (turnstile.runtime.versioning); an unversioned turn would move to the
    current version, whatever code that runs."""
    found = []
    query = f"WorkflowType = '{WORKFLOW_TYPE}' AND ExecutionStatus = 'Running'"
    if unversioned_only:
        query += " AND TemporalWorkerDeploymentVersion IS NULL"
    async for wf in client.list_workflows(query, limit=limit):
        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
        events = []
        async for e in handle.fetch_history_events(page_size=OPENING_EVENTS):
            events.append(e)
            if len(events) >= OPENING_EVENTS:
                break
        version = turn_version(events)
        if version is not None and version < TURN_VERSION:
            found.append(OlderTurn(wf.id, wf.run_id or "", version))
    return found


def refusal(older: list[OlderTurn], namespace: str) -> str:
    """What the operator is told when the worker refuses to start."""
    shown = ", ".join(f"{t.workflow_id} (version {t.version})" for t in older[:10])
    more = f" and {len(older) - 10} more" if len(older) > 10 else ""
    return (
        f"{len(older)} turn(s) of an older Turnstile version are running in namespace "
        f"{namespace!r}: {shown}{more}. This worker runs turn version {TURN_VERSION} and "
        "cannot continue them (their histories replay only on the code that started them). "
        "Drain first: keep a worker of the old version serving the task queue until they "
        "end (approve or reject what they wait for), or cancel them "
        "(`temporal workflow cancel --workflow-id ID`: calls are settled and effects undone); "
        "then start this worker. TURNSTILE_UPGRADE_CHECK=off skips this check: the old "
        "turns then fail their workflow tasks on this worker (nondeterminism) until a worker "
        "of their version takes them.")
