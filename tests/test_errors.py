"""Error types are stable names (they appear in `error.type`, in Temporal
failures and in recorded histories): derived from the class name unless the
class spells out an older one, never changed by a rename or a subclass."""

from __future__ import annotations

import pytest

from turnstile.engine import errors
from turnstile.extras import MissingExtra
from turnstile.outbox.store import DeliveryInProgress
from turnstile.providers.openai_compat import (
    IncompleteStreamError,
    InvalidRequestAnswer,
    RetryableModelError,
)
from turnstile.providers.openai_stream import IncompleteStream
from turnstile.runtime.apps import AppLoadError
from turnstile.runtime.guardrails import GuardrailError
from turnstile.runtime.mcp.sessions import MCPCallLost, MCPUnavailable
from turnstile.runtime.tools import ToolExecutionError
from turnstile.sales.access import QueryTooLong, ToolRoleUnavailable
from turnstile.sales.query import EmptyConditionError
from turnstile.stores.runs import RunUnconfirmed
from turnstile.stores.schema import SchemaError
from turnstile.stores.schema_window import NewerSchema

STABLE = {
    errors.UnknownServiceError: "UnknownService",
    errors.MemoryConflictError: "MemoryConflict",
    errors.ConversationOwnershipError: "ConversationNotOwned",
    errors.UnknownToolError: "UnknownTool",
    errors.ConversationBusy: "ConversationBusy",
    errors.NewMessageRefused: "NewMessageRefused",
    errors.TurnSteered: "TurnSteered",
    errors.RunSuperseded: "RunSuperseded",
    errors.ResetConflict: "ResetConflict",
    RunUnconfirmed: "RunUnconfirmed",  # internal: a claim waits for Temporal's word
    DeliveryInProgress: "DeliveryInProgress",  # retryable: a cancel meets a new attempt
    errors.DatabaseUnavailable: "DatabaseUnavailable",
    errors.InvalidTurnInput: "InvalidTurnInput",
    errors.MessageTooLong: "MessageTooLong",
    errors.DecisionRefused: "DecisionRefused",
    errors.DatabaseRefusedData: "DatabaseRefusedData",
    errors.UnexpectedError: "UnexpectedError",
    errors.IllegalTransition: "IllegalTransition",  # a move the turn's machine refuses
    errors.UnreadableData: "UnreadableData",
    errors.DamagedRow: "DamagedRow",  # a stored row no read can take: named, not retried
    errors.TemplateVariableMissing: "TemplateVariableMissing",
    errors.ModelRequestRejected: "ModelRequestRejected",
    errors.ModelFunctionError: "ModelFunctionError",
    NewerSchema: "NewerSchema",  # the database is newer than this code and not compatible
    errors.ModelUnavailable: "ModelUnavailable",
    RetryableModelError: "ModelUnavailable",  # a variant keeps its parent's name
    InvalidRequestAnswer: "ModelUnavailable",  # ... until it repeats: ModelServerRefused
    errors.ModelServerRefused: "ModelServerRefused",  # the same invalid-request 5xx, thrice
    errors.MalformedModelResponse: "MalformedModelResponse",
    errors.ModelOutputUnparsed: "ModelOutputUnparsed",  # the server could not read the reply
    errors.RoundTripCapExceeded: "RoundTripCapExceeded",
    errors.TooManyToolCalls: "TooManyToolCalls",
    errors.LoopDetected: "LoopDetected",
    errors.ToolArgumentError: "ToolArgumentError",
    errors.ToolCallRejected: "ToolCallRejected",
    errors.FatalToolFailure: "FatalToolFailure",
    errors.TurnCancelled: "TurnCancelled",
    errors.AttachmentError: "AttachmentError",
    errors.SystemTransformerError: "SystemTransformerError",
    errors.RetrievalError: "RetrievalError",
    errors.ModerationUnavailable: "ModerationUnavailable",
    errors.ModerationFlagged: "ModerationFlagged",
    errors.InputGuardrailFailed: "InputGuardrailFailed",
    errors.InputGuardrailFatal: "InputGuardrailFatal",
    errors.OutputGuardrailFailed: "OutputGuardrailFailed",
    errors.OutputGuardrailFatal: "OutputGuardrailFatal",
    errors.OutputGuardrailRetriesExhausted: "OutputGuardrailRetriesExhausted",
    errors.OutputParseError: "OutputParseError",
    errors.NoCompensation: "NoCompensation",
    errors.NotInWorkflow: "NotInWorkflow",
    MissingExtra: "MissingExtra",  # an optional part's libraries are not installed
    GuardrailError: "GuardrailError",
    ToolExecutionError: "ToolExecutionError",
    EmptyConditionError: "EmptyConditionError",  # returned to the model as an argument error
    errors.AnswerTruncated: "AnswerTruncated",
    errors.ContentFiltered: "ContentFiltered",
    errors.EmptyAnswer: "EmptyAnswer",  # an empty answer, asked for once more
    errors.ToolCallAsText: "ToolCallAsText",  # a tool call written as text, not run
    errors.DeadEndCalls: "DeadEndCalls",  # dead-end calls, also after the no-tools ask
    errors.FabricatedToolResult: "FabricatedToolResult",  # a tool result the model wrote
    errors.ModelResponseTooLarge: "ModelResponseTooLarge",
    errors.MCPServerUnavailable: "MCPServerUnavailable",
    IncompleteStream: "IncompleteStream",
    IncompleteStreamError: "IncompleteStream",  # the provider's variant keeps the name
    MCPUnavailable: "MCPUnavailable",
    MCPCallLost: "MCPCallLost",
    SchemaError: "SchemaError",  # a database the migrations cannot take forward
    QueryTooLong: "QueryTooLong",  # a tool statement past its statement timeout
    ToolRoleUnavailable: "ToolRoleUnavailable",  # least privilege fails closed
    errors.CallTakenOver: "CallTakenOver",  # a later attempt claimed the call
    errors.CallNotRecorded: "CallNotRecorded",  # the call journal's record failed
    errors.BudgetExceeded: "BudgetExceeded",  # the user's daily token budget is spent
    AppLoadError: "AppLoadError",  # an app or plugin the environment names cannot be loaded
}


@pytest.mark.parametrize("cls,name", STABLE.items(), ids=lambda v: getattr(v, "__name__", v))
def test_error_type_is_stable(cls: type[errors.TurnstileError], name: str) -> None:
    assert cls.error_type == name
    assert cls("x").error_type == name


def test_every_error_class_is_pinned() -> None:
    def walk(c: type[errors.TurnstileError]) -> set[type[errors.TurnstileError]]:
        return {c} | {d for s in c.__subclasses__() for d in walk(s)}

    found = {c for c in walk(errors.TurnstileError)
             if c.__module__.startswith("turnstile.")}
    abstract = {errors.TurnstileError, errors.ConfigurationError, errors.DuplicateToolError,
                errors.BreakerTripped}
    assert found - abstract - set(STABLE) == set()
