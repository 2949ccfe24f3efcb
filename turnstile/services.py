"""Services: a named set of tools plus the prompts and policies of its turns."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from turnstile.errors import ConfigurationError, UnknownServiceError
from turnstile.specs import LoopPolicy, ServiceSpec
from turnstile.tools import Tool, ToolRegistry


@dataclass(frozen=True)
class ProviderContext:
    conversation_id: str
    user_id: str
    state: dict[str, Any]  # merged `turnstile.state` of the conversation's tool results
    known: list[str]  # tools the model has already seen this turn


@dataclass
class ToolProvider:
    """A dynamic tool provider: offers tools from its catalogue according to
    the conversation's state. Asked before each round; it can only add tools."""

    name: str
    catalogue: ToolRegistry
    select: Callable[[ProviderContext], Iterable[str]]


@dataclass
class Service:
    name: str
    tools: ToolRegistry
    system_prompt: str = ""
    user_template: str = "{{message}}"
    description: str = ""
    loop: LoopPolicy = field(default_factory=LoopPolicy)
    providers: list[ToolProvider] = field(default_factory=list)

    def __post_init__(self) -> None:
        # One namespace of tool names across static tools and catalogues.
        seen = set(self.tools.names())
        for p in self.providers:
            for name in p.catalogue.names():
                if name in seen:
                    raise ConfigurationError(
                        f"service {self.name!r}: tool {name!r} is registered twice")
                seen.add(name)

    def spec(self) -> ServiceSpec:
        return ServiceSpec(
            name=self.name,
            description=self.description,
            system_prompt=self.system_prompt,
            user_template=self.user_template,
            tools=[t.spec for t in self.tools],
            loop=self.loop,
            dynamic_tools=bool(self.providers),
        )

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
        try:
            return self._services[name]
        except KeyError:
            known = ", ".join(sorted(self._services)) or "none"
            raise UnknownServiceError(f"unknown service {name!r}; known services: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._services)
