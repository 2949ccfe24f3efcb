"""`begin_turn`: the bookkeeping that opens a turn, in one local activity.

Step 1 of the pipeline (ownership, the conversation's lock, repairs, a memory
snapshot) and the service's spec as this worker runs it. One activity, run
as a local activity, so opening a turn costs one marker in history instead of
two scheduled activities and their workflow tasks (issue 13). When another
turn holds the conversation, it says so instead of waiting: the workflow then
waits in the activity `turnstile.load_memory`, whose retries the server keeps.
"""

from __future__ import annotations

from temporalio import activity

from activities.memory import REFUSED, MemoryActivities
from activities.runtime import Runtime, application_error
from activities.service import ServiceActivities
from turnstile.engine.activity_io import (
    BEGIN_TURN,
    BeginTurnInput,
    BeginTurnResult,
    MemorySnapshot,
)
from turnstile.engine.errors import ConversationBusy, DatabaseUnavailable
from turnstile.engine.versions import TURN_REVISION


class TurnActivities:
    def __init__(self, rt: Runtime, service: ServiceActivities,
                 memory: MemoryActivities) -> None:
        self.rt, self.service, self.memory = rt, service, memory

    @activity.defn(name=BEGIN_TURN)
    async def begin_turn(self, req: BeginTurnInput) -> BeginTurnResult:
        spec = self.service.describe(req.service)
        busy = None
        try:
            snapshot: MemorySnapshot | None = await self.memory.load(
                req.conversation_id, req.user_id, req.execution_chain)
        except ConversationBusy as exc:
            # Another turn holds the conversation: the workflow waits in the
            # activity load_memory, retried by the server (a local activity
            # would retry on this worker and fill history with timers).
            snapshot, busy = None, str(exc)
        except REFUSED as exc:  # e.g. a foreign conversation, a reset that conflicts
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc
        # Tools travel by name; their policies come with the model's first call
        # of each (activities.model), so history holds only the tools a turn uses.
        names = [t.name for t in spec.tools]
        return BeginTurnResult(spec=spec.model_copy(update={"tools": []}), tool_names=names,
                               memory=snapshot, busy=busy, revision=TURN_REVISION)
