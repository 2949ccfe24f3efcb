"""`begin_turn`: the bookkeeping that opens a turn, in one local activity.

Step 1 of the pipeline (ownership, the conversation's lock, repairs, a memory
snapshot) and the service's spec as this worker runs it; then, from revision
2, steps 4 and 5 when nothing the workflow runs comes between (the "turn
started" event, retrieval). One activity, run as a local activity, so
opening a turn costs one marker in history instead of scheduled activities
and their workflow tasks. When another
turn holds the conversation, it says so instead of waiting: the workflow then
waits in the activity `turnstile.load_memory`, whose retries the server keeps.
"""

from __future__ import annotations

import asyncio
import logging

from temporalio import activity

from turnstile.activities.conversation_memory import REFUSED, MemoryActivities
from turnstile.activities.pipeline import deliver, retrieve_snippets
from turnstile.activities.runtime import Runtime, application_error, turn_workflow_id
from turnstile.activities.service_spec import ServiceActivities
from turnstile.engine.activity_io import (
    BEGIN_TURN,
    BeginTurnInput,
    BeginTurnResult,
    MemorySnapshot,
    Opened,
    Retrieved,
    RetrieveInput,
    TurnOpening,
)
from turnstile.engine.errors import ConversationBusy, DatabaseUnavailable, TurnstileError
from turnstile.engine.specs import ServiceSpec
from turnstile.engine.turn_rules import render_template
from turnstile.engine.versions import TURN_REVISION

log = logging.getLogger("turnstile.activities")

# begin_turn has 30 s (workflows.tool_options.bookkeeping_options) and is
# retried whole: what it does for steps 4 and 5 gets a budget of its own, and
# what does not fit is left to the workflow (the retriever then runs as
# `turnstile.retrieve`, with its own timeout and retries).
EVENTS_BUDGET_SECONDS = 5.0
RETRIEVAL_BUDGET_SECONDS = 10.0


class TurnActivities:
    def __init__(self, rt: Runtime, service: ServiceActivities,
                 memory: MemoryActivities) -> None:
        self.rt, self.service, self.memory = rt, service, memory

    @activity.defn(name=BEGIN_TURN)
    async def begin_turn(self, req: BeginTurnInput) -> BeginTurnResult:
        # In a thread: a service's approvers may come from the database.
        spec = await asyncio.to_thread(self.service.describe, req.service)
        busy, queued = None, ""
        try:
            snapshot: MemorySnapshot | None = await self.memory.load(
                req.conversation_id, req.user_id, req.execution_chain, spec.on_new_message)
        except ConversationBusy as exc:
            # Another turn holds the conversation: the workflow waits in the
            # activity load_memory, retried by the server (a local activity
            # would retry on this worker and fill history with timers).
            snapshot, busy, queued = None, str(exc), exc.queued_behind
        except REFUSED as exc:  # e.g. a foreign conversation, a reset that conflicts
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc
        opened = None
        if snapshot is not None and req.opening is not None:
            opened = await self._open_turn(req, req.opening, spec)
        # Tools travel by name; their policies come with the model's first call
        # of each (activities.model), so history holds only the tools a turn uses.
        names = [t.name for t in spec.tools]
        return BeginTurnResult(spec=spec.model_copy(update={"tools": []}), tool_names=names,
                               memory=snapshot, busy=busy, queued_behind=queued,
                               revision=TURN_REVISION,
                               opened=opened)

    async def _open_turn(self, req: BeginTurnInput, opening: TurnOpening,
                         spec: ServiceSpec) -> Opened | None:
        """Steps 4 and 5 here, with the conversation held, when nothing the
        workflow runs comes between them and step 1 (a system transformer
        does): "turn started" goes out, then the retriever runs once, on the
        user message as step 3 renders it. Whatever does not work out here is
        left to the workflow's own steps (the retriever's errors included:
        `turnstile.retrieve` retries them and fails the turn with their type)."""
        pipe = spec.pipeline
        if pipe.system_transformer:
            return None
        delivered = False
        if pipe.policy.events and opening.events:
            events = [e.model_copy(update={"service": spec.name}) for e in opening.events]
            try:
                await asyncio.wait_for(deliver(self.rt, events), EVENTS_BUDGET_SECONDS)
            except TimeoutError:  # a listener still running: delivering again would repeat it
                log.warning("turn %s: event listeners took over %.0f s; not waiting for them",
                            turn_workflow_id(), EVENTS_BUDGET_SECONDS)
            delivered = True
        if not pipe.retriever:
            return Opened(events_delivered=delivered)
        try:
            query = render_template(spec.user_template, opening.variables)
            retrieved: Retrieved | None = await asyncio.wait_for(retrieve_snippets(
                self.rt, self.rt.services.get(spec.name), RetrieveInput(
                    conversation_id=req.conversation_id, user_id=req.user_id,
                    service=spec.name, query=query, raw_message=opening.raw_message,
                    top_k=pipe.policy.retrieval_top_k, max_chars=pipe.policy.retrieval_max_chars)),
                RETRIEVAL_BUDGET_SECONDS)
        except TimeoutError:
            log.info("retriever of %s took over %.0f s in begin_turn: left to step 5",
                     spec.name, RETRIEVAL_BUDGET_SECONDS)
            retrieved = None
        except TurnstileError as exc:  # a template the workflow refuses at step 3, or the store
            log.info("begin_turn left retrieval to step 5: %s", exc)
            retrieved = None
        except Exception as exc:  # the service's retriever: step 5 retries it
            log.warning("retriever of %s failed in begin_turn (step 5 retries it): %s: %s",
                        spec.name, type(exc).__name__, exc)
            retrieved = None
        return Opened(events_delivered=delivered, retrieved=retrieved)
