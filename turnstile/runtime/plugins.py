"""Which services a worker serves: those the caller brings plus plugins.

TURNSTILE_PLUGINS is a comma-separated list of `module:function`; each
function receives the ServiceRegistry and adds services to it. This is how a
team registers its own tools without editing worker.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from turnstile.engine.errors import ConfigurationError
from turnstile.runtime.config import Settings
from turnstile.runtime.services import Service, ServiceRegistry


def load_services(settings: Settings, services: Iterable[Service] = ()) -> ServiceRegistry:
    """`services` (worker.py passes the reference app's) plus every plugin's."""
    registry = ServiceRegistry(services)
    for spec in settings.plugins:
        module_name, _, func_name = spec.strip().partition(":")
        if not func_name:
            raise ConfigurationError(f"TURNSTILE_PLUGINS entry {spec!r} must be module:function")
        register = getattr(importlib.import_module(module_name), func_name)
        register(registry)
    return registry
