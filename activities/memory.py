"""Activities at the edges of a turn: service description and chat memory."""

from __future__ import annotations

from temporalio import activity

from activities.runtime import Runtime, application_error
from turnstile.activity_io import (
    APPEND_MESSAGES,
    DESCRIBE_SERVICE,
    LOAD_MEMORY,
    RESOLVE_TOOLS,
    AppendMessagesInput,
    DescribeServiceInput,
    LoadMemoryInput,
    MemorySnapshot,
    ResolvedTools,
    ResolveToolsInput,
)
from turnstile.errors import (
    ConversationOwnershipError,
    DatabaseUnavailable,
    MemoryConflictError,
    UnknownServiceError,
)
from turnstile.services import ProviderContext
from turnstile.specs import ServiceSpec


class MemoryActivities:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @activity.defn(name=DESCRIBE_SERVICE)
    def describe_service(self, req: DescribeServiceInput) -> ServiceSpec:
        try:
            # Step 9's choice (schema vs instructions) depends on this worker's provider.
            takes_schema = bool(getattr(self.rt.provider, "supports_response_format", False))
            spec = self.rt.services.get(req.service).spec(provider_takes_schema=takes_schema)
        except UnknownServiceError as exc:
            raise application_error(exc, non_retryable=True) from exc
        spec.search_attributes = self.rt.search_attributes
        return spec

    @activity.defn(name=LOAD_MEMORY)
    def load_memory(self, req: LoadMemoryInput) -> MemorySnapshot:
        try:
            return self.rt.memory.snapshot(req.conversation_id, req.user_id)
        except ConversationOwnershipError as exc:
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc

    @activity.defn(name=RESOLVE_TOOLS)
    def resolve_tools(self, req: ResolveToolsInput) -> ResolvedTools:
        """Ask the service's providers; return only tools the model has not seen."""
        service = self.rt.services.get(req.service)
        ctx = ProviderContext(conversation_id=req.conversation_id, user_id=req.user_id,
                              state=self.rt.memory.state(req.conversation_id), known=req.known)
        return ResolvedTools(added=[t.spec for t in service.offered(ctx)
                                    if t.name not in req.known])

    @activity.defn(name=APPEND_MESSAGES)
    def append_messages(self, req: AppendMessagesInput) -> None:
        wf_id = activity.info().workflow_id
        try:
            self.rt.memory.append(req.conversation_id, req.start_seq, req.messages, wf_id)
            for e in req.audit:
                self.rt.audit.settled(
                    workflow_id=wf_id, call_id=e.call_id, conversation_id=req.conversation_id,
                    user_id=req.user_id, tool_name=e.tool_name, arguments=e.arguments,
                    status=e.status, error=e.error)
            for d in req.decisions:
                self.rt.audit.decision(workflow_id=wf_id, tool_name=d.tool_name,
                                       tool_call_id=d.tool_call_id, approved=d.approved,
                                       reviewer=d.reviewer, note=d.note,
                                       decided_at=d.decided_at)
        except MemoryConflictError as exc:
            raise application_error(exc, non_retryable=True) from exc
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc
