"""Activities at the edges of a turn: service description and chat memory."""

from __future__ import annotations

from temporalio import activity

from activities.runtime import Runtime, application_error
from turnstile.activity_io import (
    APPEND_MESSAGES,
    DESCRIBE_SERVICE,
    LOAD_MEMORY,
    AppendMessagesInput,
    DescribeServiceInput,
    LoadMemoryInput,
    MemorySnapshot,
)
from turnstile.errors import (
    ConversationOwnershipError,
    DatabaseUnavailable,
    MemoryConflictError,
    UnknownServiceError,
)
from turnstile.specs import ServiceSpec


class MemoryActivities:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @activity.defn(name=DESCRIBE_SERVICE)
    def describe_service(self, req: DescribeServiceInput) -> ServiceSpec:
        try:
            return self.rt.services.get(req.service).spec()
        except UnknownServiceError as exc:
            raise application_error(exc, non_retryable=True) from exc

    @activity.defn(name=LOAD_MEMORY)
    def load_memory(self, req: LoadMemoryInput) -> MemorySnapshot:
        try:
            return self.rt.memory.snapshot(req.conversation_id, req.user_id)
        except ConversationOwnershipError as exc:
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc

    @activity.defn(name=APPEND_MESSAGES)
    def append_messages(self, req: AppendMessagesInput) -> None:
        try:
            self.rt.memory.append(
                req.conversation_id, req.start_seq, req.messages, activity.info().workflow_id
            )
        except MemoryConflictError as exc:
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc
