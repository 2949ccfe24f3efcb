"""Which services a worker serves: the reference service plus plugins.

TURNSTILE_PLUGINS is a comma-separated list of `module:function`; each
function receives the ServiceRegistry and adds services to it. This is how a
team registers its own tools without editing worker.py.
"""

from __future__ import annotations

import importlib

from turnstile.config import Settings
from turnstile.errors import ConfigurationError
from turnstile.services import ServiceRegistry


def load_services(settings: Settings) -> ServiceRegistry:
    from turnstile.sales.service import build_sales_service

    registry = ServiceRegistry([build_sales_service()])
    for spec in settings.plugins:
        module_name, _, func_name = spec.strip().partition(":")
        if not func_name:
            raise ConfigurationError(f"TURNSTILE_PLUGINS entry {spec!r} must be module:function")
        register = getattr(importlib.import_module(module_name), func_name)
        register(registry)
    return registry
