"""Steps 4 and 17: the "turn started" and "turn completed" events
(docs/pipeline.md) for the service's listeners.

An event rides with the bookkeeping next to it: "turn started" (step 4)
with retrieval (step 5), delivered before the retriever runs; "turn
completed" (17) with the conversation's release, delivered once it is
released. With no such activity to carry it, an event is a local activity
of its own, started, not awaited: it goes out while the turn goes on and is
collected before the turn returns. A listener never changes the turn's
outcome. Deterministic code only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import activity_io as io
    from turnstile.engine.contract import TurnInput, TurnResult, TurnStatus
    from turnstile.engine.events import TurnCompleted, TurnStarted
    from turnstile.engine.specs import ServiceSpec
    from turnstile.workflows.state import TurnState, failure_reason
    from turnstile.workflows.tool_options import event_options


def turn_ids(turn: TurnInput) -> dict[str, str]:
    """The turn's identity fields, as the pipeline's inputs and events carry them."""
    return {"conversation_id": turn.conversation_id, "user_id": turn.user_id,
            "service": turn.service}


class TurnEvents:
    def __init__(self, state: TurnState, turn: TurnInput, spec: ServiceSpec) -> None:
        self.s, self.turn = state, turn
        self.policy = spec.pipeline.policy
        self.started_at: datetime | None = None
        self.published: list[tuple[str, workflow.ActivityHandle[list[str]]]] = []
        # Events waiting for the next bookkeeping activity to carry them.
        self.pending: list[TurnStarted | TurnCompleted] = []

    def _publish(self, event: TurnStarted | TurnCompleted) -> None:
        if not self.policy.events:
            return
        # Turns begun before revision 1 publish each event as a local activity
        # of its own, and replay so.
        if self.s.revision.events_ride_along:
            self.pending.append(event)
        else:
            self._start_publish(event)

    def _start_publish(self, event: TurnStarted | TurnCompleted) -> None:
        self.published.append((event.kind, workflow.start_local_activity(
            io.PUBLISH_EVENT, event, result_type=list[str], **event_options())))

    def take(self) -> list[TurnStarted | TurnCompleted]:
        """The events for the bookkeeping activity about to run to deliver."""
        pending, self.pending = self.pending, []
        return pending

    def publish_pending(self) -> None:
        """Events no bookkeeping activity carried (no retriever; no lock to
        release, or its release failed): a local activity each."""
        for event in self.take():
            self._start_publish(event)

    async def delivered(self) -> None:
        """Wait for the events started so far (a failed delivery is logged)."""
        published, self.published = self.published, []
        for kind, handle in published:
            try:
                await handle
            except (ActivityError, ApplicationError) as exc:
                workflow.logger.warning("%s not delivered: %s", kind, failure_reason(exc))

    def _ids(self, kind: str) -> dict[str, Any]:
        info = workflow.info()
        return {"event_id": f"{info.workflow_id}/{info.run_id}/{kind}",
                "workflow_id": info.workflow_id, "run_id": info.run_id,
                **turn_ids(self.turn), "at": workflow.now().isoformat()}

    def started_event(self) -> TurnStarted:
        return TurnStarted(**self._ids("turn_started"))

    def turn_started(self, delivered: bool) -> None:
        """Step 4; `delivered`: begin_turn delivered the event already."""
        self.started_at = workflow.now()
        self.s.event("turn_started",
                     f"conversation {self.turn.conversation_id}, user {self.turn.user_id}")
        if delivered:
            return
        self._publish(self.started_event())

    def turn_completed(self, result: TurnResult | None, status: TurnStatus) -> None:
        # In milliseconds, as Temporal shows times: microseconds said nothing
        # more, and their seven digits sent every event line through the
        # masking's phone matcher (~2 ms of worker CPU per turn).
        elapsed = (round((workflow.now() - self.started_at).total_seconds(), 3)
                   if self.started_at else 0.0)
        s = self.s
        self._publish(TurnCompleted(
            **self._ids("turn_completed"), status=status, round_trips=s.round_trips,
            tool_calls=len(s.calls), usage=s.usage, duration_seconds=elapsed,
            error_type=result.error.type if result and result.error else None))
