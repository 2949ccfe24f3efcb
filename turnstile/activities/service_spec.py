"""Activities that describe a service to the workflow: its spec (policies, tool
specs, pipeline flags — recorded in history) and the tools its dynamic
providers add before a round."""

from __future__ import annotations

import logging

from temporalio import activity

from turnstile.activities.runtime import Activities, application_error, model_name, with_heartbeat
from turnstile.engine.activity_io import (
    RESOLVE_TOOLS,
    ResolvedTools,
    ResolveToolsInput,
)
from turnstile.engine.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    UnknownServiceError,
)
from turnstile.engine.specs import ServiceSpec
from turnstile.providers.tokens import context_tokens, window_tokens
from turnstile.runtime.services import ApproverContext, ProviderContext

log = logging.getLogger("turnstile.activities")

# A provider that cannot be reached (an MCP server down) fails this many
# attempts of resolve_tools, retried by Temporal; then the round goes on
# without its tools and the turn's events say so.
PROVIDER_ATTEMPTS = 3


class ServiceActivities(Activities):
    def describe(self, name: str) -> ServiceSpec:
        """The service's spec as this worker runs it (policies, tools, pipeline
        flags, approvers, search attributes). Blocking: the approvers may be
        read from the database, so callers run it in a thread."""
        try:
            # Step 9's choice (schema vs instructions) depends on this worker's provider.
            takes_schema = bool(getattr(self.rt.provider_for(name), "supports_response_format",
                                        False))
            service = self.rt.services.get(name)
            spec = service.spec(
                provider_takes_schema=takes_schema, model_window_tokens=window_tokens(
                    context_tokens(model_name(self.rt), self.rt.settings.context_tokens)))
        except UnknownServiceError as exc:
            raise application_error(exc, non_retryable=True) from exc
        try:
            spec.approvals = service.approval_policy(ApproverContext(
                service=service.name, db=self.rt.db, settings=self.rt.settings,
                tools=[t.name for t in spec.tools if t.requires_approval]))
        except DatabaseUnavailable as exc:
            raise application_error(exc, non_retryable=False) from exc
        spec.search_attributes = self.rt.search_attributes
        return spec

    @activity.defn(name=RESOLVE_TOOLS)
    async def resolve_tools(self, req: ResolveToolsInput) -> ResolvedTools:
        """Ask the service's providers; return only tools the model has not seen.

        Providers with a remote catalogue (MCP servers) are listed here, on the
        worker; the result is recorded, so a replay never asks them again."""
        service = self.rt.services.get(req.service)
        try:
            # Heartbeating: opening MCP sessions may take a while.
            failed = await with_heartbeat(service.refresh_providers())
        except ConfigurationError as exc:
            raise application_error(exc, non_retryable=True) from exc
        if failed and activity.info().attempt < PROVIDER_ATTEMPTS:
            raise application_error(failed[0][1], non_retryable=False)
        unavailable = []
        for provider, error in failed:
            log.warning("tools of %s left out of this round: %s", provider, error)
            unavailable.append(f"{provider}: {error}")
        state = await self.rt.db.call(self.rt.memory.state, req.conversation_id)
        ctx = ProviderContext(conversation_id=req.conversation_id, user_id=req.user_id,
                              state=state, known=req.known)
        return ResolvedTools(added=[t.spec.policy() for t in service.offered(ctx)
                                    if t.name not in req.known], unavailable=unavailable)
