"""The repository's top-level `workflows` and `activities` packages are
other names of turnstile.workflows and turnstile.activities (they are not
installed; pyproject.toml). Each of their submodules is registered under the
old name too, so `from workflows.agent_turn import X` gets the same module
object — never a second copy with its own classes."""

from __future__ import annotations

import importlib
import pkgutil
import sys


def alias_package(alias: str, real: str) -> None:
    """Make `alias.X` the module `real.X` for every submodule of `real`."""
    package = importlib.import_module(real)
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{real}.{info.name}")
        sys.modules[f"{alias}.{info.name}"] = module
        setattr(sys.modules[alias], info.name, module)
