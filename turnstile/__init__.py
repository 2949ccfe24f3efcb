"""Turnstile: durable, auditable LLM tool-calling turns on Temporal.

Five layers; arrows point one way (a lower layer never imports a higher one,
and `tests/test_layers.py` fails on a violation or an import cycle):

    app      turnstile.sales      the reference sales/e-mail service
    activity turnstile.activities the activity names, wired to the runtime, stores, providers
             turnstile.outbox     the public outbox apps add (table, sender, local SMTP)
    runtime  turnstile.runtime    config, services, apps, plugins, tools, tracing, client, dev stack
             turnstile.providers  model providers (OpenAI-compatible HTTP, offline demo planner)
    stores   turnstile.stores     database, memory, ledger, audit, lock, payloads, streaming, RAG
    engine   turnstile.engine     messages, specs, policies, rules, breakers, errors, events, wire

`turnstile.workflows` imports only the engine; the command line
(`turnstile.cli`: the worker and the operator's commands) and
`turnstile.TurnstilePlugin` sit on top and hand the app to the runtime
explicitly (`turnstile.sales.app`: services, tables and their privileges,
demo script, dev services; see turnstile.runtime.apps). Outside the layers:
`turnstile.migrations` (Alembic revisions of every component's tables; they
import no project module) and `turnstile.db` (the operator's `python -m
turnstile.db upgrade|current|query-window`, which passes the app on too).

The public API is what `__all__` names: `from turnstile import tool, Service,
App, ...` — a service author and a client program need nothing else (the
test kit is `turnstile.testing`). Everything else is private and may change.
The names are loaded on first use (`__getattr__`), so `import turnstile`
alone imports nothing: workflow code, which imports `turnstile.engine`
through this package, stays light, and no layer is pulled in by the root.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnstile.client import (
        ApprovalRefused as ApprovalRefused,
        ClientError as ClientError,
        TurnCancelledError as TurnCancelledError,
        TurnEndedError as TurnEndedError,
        TurnFailedError as TurnFailedError,
        TurnHandle as TurnHandle,
        TurnNotFound as TurnNotFound,
        TurnOutcome as TurnOutcome,
        TurnstileClient as TurnstileClient,
        TurnTerminatedError as TurnTerminatedError,
        TurnTimedOutError as TurnTimedOutError,
    )
    from turnstile.engine.approvals import OutboundPolicy as OutboundPolicy
    from turnstile.engine.breakers import BreakerPolicy as BreakerPolicy
    from turnstile.engine.contract import (
        TurnInput as TurnInput,
        TurnResult as TurnResult,
    )
    from turnstile.engine.equivalence import (
        AS_SET as AS_SET,
        CASELESS as CASELESS,
        EMAIL_ADDRESS as EMAIL_ADDRESS,
        VERBATIM as VERBATIM,
        Equivalence as Equivalence,
    )
    from turnstile.engine.errors import (
        ConfigurationError as ConfigurationError,
        ToolArgumentError as ToolArgumentError,
        TurnstileError as TurnstileError,
    )
    from turnstile.engine.flow import (
        FLOW_RULES as FLOW_RULES,
        FlowRule as FlowRule,
        FlowVerdict as FlowVerdict,
        ProvenanceSource as ProvenanceSource,
    )
    from turnstile.engine.memory_window import MemoryWindow as MemoryWindow
    from turnstile.engine.messages import (
        ChatMessage as ChatMessage,
        ToolCall as ToolCall,
    )
    from turnstile.engine.model_settings import ModelSettings as ModelSettings
    from turnstile.engine.pipeline_spec import PipelinePolicy as PipelinePolicy
    from turnstile.engine.specs import (
        LoopPolicy as LoopPolicy,
        RetrySpec as RetrySpec,
    )
    from turnstile.outbox.component import Outbox as Outbox
    from turnstile.providers.base import (
        ModelProvider as ModelProvider,
        ModelRequest as ModelRequest,
        ModelResponse as ModelResponse,
    )
    from turnstile.providers.function_model import (
        Call as Call,
        FunctionModel as FunctionModel,
        ModelCall as ModelCall,
        Reply as Reply,
        ScriptedModel as ScriptedModel,
        ToolOutcome as ToolOutcome,
        call as call,
    )
    from turnstile.runtime.apps import (
        App as App,
        AppLoadError as AppLoadError,
        BackgroundContext as BackgroundContext,
        DevService as DevService,
    )
    from turnstile.runtime.config import Settings as Settings
    from turnstile.runtime.guardrails import (
        GuardrailResult as GuardrailResult,
        InputGuardrailContext as InputGuardrailContext,
        OutputGuardrailContext as OutputGuardrailContext,
    )
    from turnstile.runtime.services import (
        ApproverContext as ApproverContext,
        Service as Service,
        ServiceRegistry as ServiceRegistry,
        SystemMessageContext as SystemMessageContext,
    )
    from turnstile.runtime.tool_providers import (
        ProviderContext as ProviderContext,
        ToolProvider as ToolProvider,
    )
    from turnstile.runtime.tools import (
        Tool as Tool,
        ToolContext as ToolContext,
        ToolExecutionError as ToolExecutionError,
        ToolInterrupted as ToolInterrupted,
        ToolRegistry as ToolRegistry,
        ToolResult as ToolResult,
        Undo as Undo,
        tool as tool,
    )
    from turnstile.stores.connection import Connection as Connection
    from turnstile.stores.db import Database as Database
    from turnstile.stores.retrieval_index import Document as Document
    from turnstile.temporal_plugin import TurnstilePlugin as TurnstilePlugin

# name -> the module that holds it
_WHERE: dict[str, str] = {
    "Tool": "turnstile.runtime.tools",
    "ToolContext": "turnstile.runtime.tools",
    "ToolExecutionError": "turnstile.runtime.tools",
    "ToolInterrupted": "turnstile.runtime.tools",
    "ToolRegistry": "turnstile.runtime.tools",
    "ToolResult": "turnstile.runtime.tools",
    "Undo": "turnstile.runtime.tools",
    "tool": "turnstile.runtime.tools",
    "ApproverContext": "turnstile.runtime.services",
    "Service": "turnstile.runtime.services",
    "ServiceRegistry": "turnstile.runtime.services",
    "SystemMessageContext": "turnstile.runtime.services",
    "ProviderContext": "turnstile.runtime.tool_providers",
    "ToolProvider": "turnstile.runtime.tool_providers",
    "App": "turnstile.runtime.apps",
    "AppLoadError": "turnstile.runtime.apps",
    "BackgroundContext": "turnstile.runtime.apps",
    "DevService": "turnstile.runtime.apps",
    "Settings": "turnstile.runtime.config",
    "GuardrailResult": "turnstile.runtime.guardrails",
    "InputGuardrailContext": "turnstile.runtime.guardrails",
    "OutputGuardrailContext": "turnstile.runtime.guardrails",
    "LoopPolicy": "turnstile.engine.specs",
    "RetrySpec": "turnstile.engine.specs",
    "BreakerPolicy": "turnstile.engine.breakers",
    "Equivalence": "turnstile.engine.equivalence",
    "EMAIL_ADDRESS": "turnstile.engine.equivalence",
    "AS_SET": "turnstile.engine.equivalence",
    "CASELESS": "turnstile.engine.equivalence",
    "VERBATIM": "turnstile.engine.equivalence",
    "OutboundPolicy": "turnstile.engine.approvals",
    "MemoryWindow": "turnstile.engine.memory_window",
    "FLOW_RULES": "turnstile.engine.flow",
    "FlowRule": "turnstile.engine.flow",
    "FlowVerdict": "turnstile.engine.flow",
    "ProvenanceSource": "turnstile.engine.flow",
    "ModelSettings": "turnstile.engine.model_settings",
    "PipelinePolicy": "turnstile.engine.pipeline_spec",
    "ChatMessage": "turnstile.engine.messages",
    "ToolCall": "turnstile.engine.messages",
    "TurnInput": "turnstile.engine.contract",
    "TurnResult": "turnstile.engine.contract",
    "ConfigurationError": "turnstile.engine.errors",
    "ToolArgumentError": "turnstile.engine.errors",
    "TurnstileError": "turnstile.engine.errors",
    "Connection": "turnstile.stores.connection",
    "Database": "turnstile.stores.db",
    "Document": "turnstile.stores.retrieval_index",
    "ModelProvider": "turnstile.providers.base",
    "ModelRequest": "turnstile.providers.base",
    "ModelResponse": "turnstile.providers.base",
    "Call": "turnstile.providers.function_model",
    "FunctionModel": "turnstile.providers.function_model",
    "ModelCall": "turnstile.providers.function_model",
    "Reply": "turnstile.providers.function_model",
    "ScriptedModel": "turnstile.providers.function_model",
    "ToolOutcome": "turnstile.providers.function_model",
    "call": "turnstile.providers.function_model",
    "ApprovalRefused": "turnstile.client",
    "ClientError": "turnstile.client",
    "TurnHandle": "turnstile.client",
    "TurnNotFound": "turnstile.client",
    "TurnCancelledError": "turnstile.client",
    "TurnEndedError": "turnstile.client",
    "TurnFailedError": "turnstile.client",
    "TurnOutcome": "turnstile.client",
    "TurnTerminatedError": "turnstile.client",
    "TurnTimedOutError": "turnstile.client",
    "TurnstileClient": "turnstile.client",
    "TurnstilePlugin": "turnstile.temporal_plugin",
    "Outbox": "turnstile.outbox.component",
}

__all__ = [
    "AS_SET", "CASELESS", "EMAIL_ADDRESS", "VERBATIM", "Equivalence",
    "App", "AppLoadError", "ApprovalRefused", "ApproverContext", "BackgroundContext",
    "BreakerPolicy", "Call", "ChatMessage", "ClientError", "ConfigurationError", "Connection",
    "Database", "DevService", "Document", "FLOW_RULES", "FlowRule", "FlowVerdict",
    "FunctionModel", "GuardrailResult",
    "InputGuardrailContext", "LoopPolicy", "MemoryWindow", "ModelCall", "ModelProvider",
    "ModelRequest", "ModelResponse", "ModelSettings", "OutboundPolicy", "Outbox",
    "OutputGuardrailContext",
    "PipelinePolicy", "ProvenanceSource", "ProviderContext", "Reply", "RetrySpec",
    "ScriptedModel", "Service",
    "ServiceRegistry", "Settings", "SystemMessageContext", "Tool", "ToolArgumentError",
    "ToolCall", "ToolContext", "ToolExecutionError", "ToolInterrupted", "ToolOutcome",
    "ToolProvider", "ToolRegistry", "ToolResult", "TurnHandle", "TurnInput", "TurnNotFound",
    "TurnResult",
    "TurnCancelledError", "TurnEndedError", "TurnFailedError", "TurnOutcome",
    "TurnTerminatedError", "TurnTimedOutError",
    "TurnstileClient", "TurnstileError", "TurnstilePlugin", "Undo", "call", "tool",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'turnstile' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
