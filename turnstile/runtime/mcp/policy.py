"""MCP tool annotations (hints) mapped onto Turnstile's own tool policy.

    readOnlyHint             -> no approval, safe to retry
    idempotentHint           -> safe to retry
    otherwise                -> not retry-safe: never re-run blindly after a lost
                                worker; the model is told the call was interrupted
    destructiveHint (or no   -> requires approval
    hints at all)

`destructiveHint` defaults to true in the MCP specification, so a tool that is
not read-only and does not say `destructiveHint: false` needs approval. A
service overrides any of this per tool (`MCPToolPolicy`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp.types import ToolAnnotations

from turnstile.runtime.mcp.config import MCPToolPolicy


@dataclass(frozen=True)
class HintPolicy:
    retry_safe: bool
    requires_approval: bool
    read_only: bool


def hint_policy(hints: ToolAnnotations | None,
                override: MCPToolPolicy | None = None) -> HintPolicy:
    read_only = bool(hints is not None and hints.read_only_hint)
    idempotent = bool(hints is not None and hints.idempotent_hint)
    destructive = not read_only and (hints is None or hints.destructive_hint is not False)
    retry_safe, approval = read_only or idempotent, destructive
    if override is not None:
        if override.retry_safe is not None:
            retry_safe = override.retry_safe
        if override.requires_approval is not None:
            approval = override.requires_approval
    return HintPolicy(retry_safe=retry_safe, requires_approval=approval, read_only=read_only)
