"""Which services a worker serves: those the caller brings plus plugins.

TURNSTILE_PLUGINS is a comma-separated list of `module:function`; each
function receives the ServiceRegistry and adds services to it. This is how a
team registers its own tools without editing worker.py.

TURNSTILE_MCP_SERVERS (a JSON list, see `turnstile.runtime.mcp.MCPServer`)
then adds MCP servers to the services they name (all services by default).
"""

from __future__ import annotations

from collections.abc import Iterable

from turnstile.engine.errors import ConfigurationError
from turnstile.runtime.apps import import_named
from turnstile.runtime.config import Settings
from turnstile.runtime.mcp.servers import parse_mcp_servers
from turnstile.runtime.services import Service, ServiceRegistry


def load_services(settings: Settings, services: Iterable[Service] = ()) -> ServiceRegistry:
    """`services` (worker.py passes the reference app's) plus every plugin's."""
    registry = ServiceRegistry(services)
    for spec in settings.plugins:
        register = import_named("TURNSTILE_PLUGINS", spec)
        register(registry)
    for server in parse_mcp_servers(settings.mcp_servers):
        unknown = sorted(set(server.services or ()) - set(registry.names()))
        if unknown:
            raise ConfigurationError(
                f"TURNSTILE_MCP_SERVERS: server {server.name!r} names unknown service(s) "
                f"{unknown}; known: {registry.names()}")
        for name in registry.names():
            if server.serves(name):
                registry.get(name).add_mcp_server(server)
    return registry
