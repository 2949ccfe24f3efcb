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

Hints are the server's word about its own tools: they are believed only for a
server configured with `trust_hints: true`. From any other server every tool
is treated as destructive and not retry-safe — it needs approval — unless the
configuration itself declares it read-only (`tools: {name: {read_only: true}}`)
or overrides the policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp.types import ToolAnnotations

from turnstile.runtime.mcp.servers import MCPToolPolicy


@dataclass(frozen=True)
class HintPolicy:
    retry_safe: bool
    requires_approval: bool
    read_only: bool


def hint_policy(hints: ToolAnnotations | None, override: MCPToolPolicy | None = None, *,
                trusted: bool = False) -> HintPolicy:
    """`trusted`: the server's hints are believed (its `trust_hints`)."""
    if not trusted:
        hints = None  # an untrusted server's word changes nothing
    if override is not None and override.read_only:
        hints = ToolAnnotations(read_only_hint=True)  # declared by the operator
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
