"""Services: a named set of tools plus the prompts, policies and pipeline
components of its turns.

The components (transformer, retriever, guardrails, moderator, return type)
are worker-side callables run in activities; `spec()` describes them as data
(names, flags, the output schema) for the workflow (docs/pipeline.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from turnstile.engine.approvals import ApprovalPolicy, OutboundPolicy
from turnstile.engine.errors import ConfigurationError, MCPServerUnavailable, UnknownServiceError
from turnstile.engine.grant_models import GrantCeiling
from turnstile.engine.memory_window import MemoryWindow
from turnstile.engine.model_settings import TOOL_CHOICE_MODES, ModelSettings
from turnstile.engine.output_format import output_spec
from turnstile.engine.pipeline_spec import PipelinePolicy, PipelineSpec
from turnstile.engine.specs import ON_NEW_MESSAGE, LoopPolicy, OnNewMessage, ServiceSpec
from turnstile.extras import require_extra
from turnstile.providers.base import ModelProvider
from turnstile.runtime.guardrails import Guardrail, component_name
from turnstile.runtime.mcp.servers import MCPServer
from turnstile.runtime.moderation import Moderator
from turnstile.runtime.tool_providers import ProviderContext, ToolProvider
from turnstile.runtime.tools import Tool, ToolRegistry
from turnstile.stores.retrieval_index import Document, FullTextRetriever, Retriever

if TYPE_CHECKING:
    from turnstile.runtime.mcp.toolset import MCPToolset

__all__ = ["ApproverContext", "ApproverResolver", "ProviderContext", "Service",
           "ServiceRegistry", "SystemMessageContext", "SystemTransformer", "ToolProvider"]


@dataclass(frozen=True)
class SystemMessageContext:
    conversation_id: str
    user_id: str
    service: str
    system_message: str  # rendered from the service's template
    variables: dict[str, Any]
    settings: Any = None  # the worker's turnstile.runtime.config.Settings


@dataclass(frozen=True)
class ApproverContext:
    service: str
    tools: list[str]  # the tools that require approval
    db: Any = None  # the worker's turnstile.stores.db.Database
    settings: Any = None


# Who may decide approvals: tool name (or "*") -> reviewer names, groups
# already resolved to their members. Runs in the begin_turn activity,
# so it may read a table or a directory; the answer is recorded in the turn's
# history and applies to the whole turn.
ApproverResolver = Callable[[ApproverContext], Mapping[str, Iterable[str]]]


# Step 2: returns the system message to use (may read clocks, files, databases:
# it runs in an activity).
SystemTransformer = Callable[[SystemMessageContext], "str | Awaitable[str]"]


@dataclass
class Service:
    name: str
    tools: ToolRegistry
    system_prompt: str = ""
    user_template: str = "{{message}}"
    description: str = ""
    loop: LoopPolicy = field(default_factory=LoopPolicy)
    providers: list[ToolProvider] = field(default_factory=list)
    # MCP servers whose tools join the service (each becomes an MCPToolset provider).
    mcp_servers: list[MCPServer] = field(default_factory=list)
    # What each model request carries; max_tokens=None: sized for the model.
    memory: MemoryWindow = field(default_factory=MemoryWindow)
    # -- pipeline components (docs/pipeline.md) --
    pipeline: PipelinePolicy = field(default_factory=PipelinePolicy)
    system_transformer: SystemTransformer | None = None  # step 2
    documents: list[Document] = field(default_factory=list)  # step 5, full-text indexed
    retriever: Retriever | None = None  # step 5; default: full text over `documents`
    input_guardrails: list[Guardrail] = field(default_factory=list)  # step 7
    output_type: type[BaseModel] | None = None  # steps 9 and 16
    moderator: Moderator | None = None  # step 11
    output_guardrails: list[Guardrail] = field(default_factory=list)  # step 15
    # -- approvals and outbound messages (docs/approvals-guide.md) --
    approvers: ApproverResolver | None = None  # default: any named reviewer but the requester
    allow_self_approval: bool = False
    outbound: OutboundPolicy = field(default_factory=OutboundPolicy)
    # A reviewer of an effectful call is shown the conversation's earlier calls
    # of the tool that look alike from this far back (0: the turn's own only).
    similar_effects_window_seconds: float = 7 * 24 * 3600.0
    # Standing approvals (docs/approvals.md, "Standing approvals (grants)"):
    # the operator's ceiling per tool name; tools without one take the default.
    grant_ceilings: dict[str, GrantCeiling] = field(default_factory=dict)
    default_grant_ceiling: GrantCeiling = field(default_factory=GrantCeiling)
    # The model of this service's turns when the worker has none (LLM_BASE_URL
    # unset), instead of the offline demo planner: e.g. a function model
    # (turnstile.testing.FunctionModel) for an offline demo.
    offline_model: ModelProvider | None = None
    # A new turn while a turn of the conversation waits for an approval
    # (docs/steering.md): "queue" (wait for it, visibly), "steer" (reject its
    # waiting calls, "the user sent a new message", and run at once) or
    # "refuse" (end the new turn `refused`).
    on_new_message: OnNewMessage = "queue"
    # What the model request asks besides the conversation (max_tokens,
    # temperature, tool_choice, schema dialect, compact prompt): docs/local-models.md.
    model: ModelSettings = field(default_factory=ModelSettings)

    def __post_init__(self) -> None:
        if self.on_new_message not in ON_NEW_MESSAGE:
            raise ConfigurationError(
                f"service {self.name!r}: on_new_message must be one of "
                f"{', '.join(ON_NEW_MESSAGE)}, not {self.on_new_message!r}")
        # One namespace of tool names across static tools and catalogues.
        seen = set(self.tools.names())
        for p in self.providers:
            for name in p.catalogue.names():
                if name in seen:
                    raise ConfigurationError(
                        f"service {self.name!r}: tool {name!r} is registered twice")
                seen.add(name)
        for server in self.mcp_servers:
            self._add_toolset(server)
        self._check_tool_choice(seen)
        if self.retriever is None and self.documents:
            self.retriever = FullTextRetriever(self.documents)
        if self.output_type is not None and not (
                isinstance(self.output_type, type) and issubclass(self.output_type, BaseModel)):
            raise ConfigurationError(
                f"service {self.name!r}: output_type must be a pydantic model class")

    def _check_tool_choice(self, names: set[str]) -> None:
        """A named tool_choice names one of the service's tools (an MCP
        server's are not known before it is listed: any name passes then)."""
        choice = self.model.tool_choice
        if choice in TOOL_CHOICE_MODES or choice in names or self.mcp_servers:
            return
        raise ConfigurationError(
            f"service {self.name!r}: tool_choice must be auto, required or one of its "
            f"tools ({', '.join(sorted(names)) or 'none'}), not {choice!r}")

    def add_mcp_server(self, server: MCPServer) -> MCPToolset:
        """Let the service use an MCP server's tools (TURNSTILE_MCP_SERVERS uses this)."""
        if any(s.name == server.name for s in self.mcp_servers):
            raise ConfigurationError(
                f"service {self.name!r}: MCP server {server.name!r} is added twice")
        self.mcp_servers.append(server)
        return self._add_toolset(server)

    def _add_toolset(self, server: MCPServer) -> MCPToolset:
        # Imported here: the MCP client library costs ~0.7 s to import, which
        # every CLI command and worker start paid without an MCP server.
        require_extra("mcp", f"MCP server {server.name!r}")
        from turnstile.runtime.mcp.toolset import MCPToolset

        toolset = MCPToolset(server, taken=self._names_outside)
        self.providers.append(toolset)
        return toolset

    def _names_outside(self, provider: ToolProvider) -> set[str]:
        """Tool names of the service that `provider` does not own."""
        names = set(self.tools.names())
        for p in self.providers:
            if p is not provider:
                names.update(p.catalogue.names())
        return names

    async def refresh_providers(self) -> list[tuple[str, MCPServerUnavailable]]:
        """Bring every provider's catalogue up to date (MCP servers are listed).

        A provider that cannot be reached does not stop the others: the
        failures are returned (provider name, error). A configuration error
        (a tool name clash) is raised."""
        failed = []
        for p in self.providers:
            try:
                await p.refresh()
            except MCPServerUnavailable as exc:
                failed.append((p.name, exc))
        return failed

    async def find_tool(self, name: str) -> Tool | None:
        """`tool(name)`, listing remote catalogues (MCP servers) first when this
        worker has not seen the name yet. Raises MCPServerUnavailable when the
        name is still unknown and a provider could not be asked."""
        found = self.tool(name)
        if found is None and self.providers:
            failed = await self.refresh_providers()
            found = self.tool(name)
            if found is None and failed:
                raise failed[0][1]
        return found

    def pipeline_spec(self, provider_takes_schema: bool = False) -> PipelineSpec:
        def name(component: object) -> str | None:
            return None if component is None else component_name(component)

        return PipelineSpec(
            policy=compact_policy(self.pipeline, self.model),
            system_transformer=name(self.system_transformer),
            # ModelSettings(documents=False): step 5 does not run.
            retriever=name(self.retriever) if self.model.documents else None,
            input_guardrails=[component_name(g) for g in self.input_guardrails],
            output=(output_spec(self.output_type, self.pipeline.output_format,
                                provider_takes_schema) if self.output_type else None),
            moderator=name(self.moderator),
            output_guardrails=[component_name(g) for g in self.output_guardrails],
        )

    def spec(self, provider_takes_schema: bool = False,
             model_window_tokens: int | None = None) -> ServiceSpec:
        """The service as data. `model_window_tokens`: what a request to the
        worker's model may carry, used when the service sets no token window."""
        memory = self.memory
        if memory.max_tokens is None and model_window_tokens is not None:
            memory = memory.model_copy(update={"max_tokens": model_window_tokens})
        return ServiceSpec(
            name=self.name,
            description=self.description,
            system_prompt=self.system_prompt,
            user_template=self.user_template,
            tools=[t.spec for t in self.tools],
            loop=self.loop,
            dynamic_tools=bool(self.providers),
            pipeline=self.pipeline_spec(provider_takes_schema),
            memory=memory,
            approvals=ApprovalPolicy(allow_self_approval=self.allow_self_approval),
            outbound=self.outbound,
            on_new_message=self.on_new_message,
            model=self.model,
        )

    def approval_policy(self, ctx: ApproverContext) -> ApprovalPolicy:
        reviewers: dict[str, list[str]] = {}
        if self.approvers is not None:
            for tool_name, names in self.approvers(ctx).items():
                reviewers[tool_name] = sorted({n.strip() for n in names if n.strip()})
        return ApprovalPolicy(reviewers=reviewers, allow_self_approval=self.allow_self_approval)

    def grant_ceiling(self, tool_name: str) -> GrantCeiling:
        """What a reviewer may grant for `tool_name` (the operator's ceiling)."""
        return self.grant_ceilings.get(tool_name, self.default_grant_ceiling)

    def tool(self, name: str) -> Tool | None:
        found = self.tools.get(name)
        for p in self.providers:
            found = found or p.catalogue.get(name)
        return found

    def offered(self, ctx: ProviderContext) -> list[Tool]:
        """Tools the providers offer now, in provider order, without duplicates."""
        out: dict[str, Tool] = {}
        for p in self.providers:
            for name in p.select(ctx):
                t = p.catalogue.get(name)
                if t is None:
                    raise ConfigurationError(
                        f"provider {p.name!r} offered {name!r}, which is not in its catalogue")
                out.setdefault(name, t)
        return list(out.values())


def compact_policy(policy: PipelinePolicy, model: ModelSettings) -> PipelinePolicy:
    """`policy` with the compact prompt's retrieval lead-in, when one is set:
    the retrieved documents follow that line instead of the template's."""
    if model.retrieval_lead_in is None:
        return policy
    template = f"{{{{message}}}}\n\n{model.retrieval_lead_in}\n{{{{contents}}}}"
    return policy.model_copy(update={"retrieval_template": template})


class ServiceRegistry:
    def __init__(self, services: Iterable[Service] = ()) -> None:
        self._services: dict[str, Service] = {}
        for s in services:
            self.add(s)

    def add(self, service: Service) -> Service:
        if service.name in self._services:
            raise ConfigurationError(f"a service named {service.name!r} is already registered")
        self._services[service.name] = service
        return service

    def get(self, name: str) -> Service:
        """The service called `name`; "" is the default (the first registered)."""
        if not name and self._services:
            return next(iter(self._services.values()))
        try:
            return self._services[name]
        except KeyError:
            known = ", ".join(sorted(self._services)) or "none"
            raise UnknownServiceError(
                f"unknown service {name!r}; known services: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._services)
