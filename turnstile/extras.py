"""The optional parts of the package and what each needs installed.

The core install (`pip install turnstile`) runs workers, turns and the
embedded dev stack on SQLite. The approvals inbox, PostgreSQL and MCP servers
each need libraries a project may not want: they are extras
(`pip install 'turnstile[inbox]'`, `[postgres]`, `[mcp]`). A module that
needs one calls `require_extra` before importing them, so a missing library is
a `MissingExtra` naming the extra to install, not a bare ModuleNotFoundError."""

from __future__ import annotations

import importlib.util

from turnstile.engine.errors import ConfigurationError

# extra -> the import names it provides (pyproject's [project.optional-dependencies])
EXTRAS: dict[str, tuple[str, ...]] = {
    "inbox": ("starlette", "uvicorn", "jinja2", "multipart"),
    "postgres": ("psycopg",),
    "mcp": ("mcp", "jsonschema"),
}


class MissingExtra(ConfigurationError, ImportError):
    """A feature's libraries are not installed; the message names the extra.
    Also an ImportError, so code that tries an import and falls back still does."""


def missing_modules(extra: str) -> list[str]:
    """The import names of `extra` that cannot be found."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require_extra(extra: str, feature: str) -> None:
    """Raise MissingExtra when a library of `extra` is not installed."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtra(
            f"{feature} needs the '{extra}' extra ({', '.join(missing)} not installed): "
            f"pip install 'turnstile[{extra}]'")
