"""Services: a named set of tools plus the prompts and policies of its turns."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from turnstile.errors import ConfigurationError, UnknownServiceError
from turnstile.specs import LoopPolicy, ServiceSpec
from turnstile.tools import Tool, ToolRegistry


@dataclass
class Service:
    name: str
    tools: ToolRegistry
    system_prompt: str = ""
    user_template: str = "{{message}}"
    description: str = ""
    loop: LoopPolicy = field(default_factory=LoopPolicy)

    def spec(self) -> ServiceSpec:
        return ServiceSpec(
            name=self.name,
            description=self.description,
            system_prompt=self.system_prompt,
            user_template=self.user_template,
            tools=[t.spec for t in self.tools],
            loop=self.loop,
        )

    def tool(self, name: str) -> Tool | None:
        return self.tools.get(name)


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
