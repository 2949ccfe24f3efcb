"""Typed errors. Each names who is at fault: configuration, the model, the user,
or the environment. `error_type` is the stable name that appears in a turn's
`error.type` and in Temporal ApplicationError types; never rename one."""

from __future__ import annotations


class TurnstileError(Exception):
    error_type = "TurnstileError"


# --- configuration (the developer's fault; fails at registration) ----------
class ConfigurationError(TurnstileError):
    error_type = "ConfigurationError"


class DuplicateToolError(ConfigurationError):
    error_type = "DuplicateToolError"


class UnknownServiceError(TurnstileError):
    error_type = "UnknownService"


# --- the environment --------------------------------------------------------
class DatabaseUnavailable(TurnstileError):
    """The database cannot be reached; retrying may help."""

    error_type = "DatabaseUnavailable"


class MemoryConflictError(TurnstileError):
    """Another writer holds a memory slot this turn tried to write."""

    error_type = "MemoryConflict"


class MCPServerUnavailable(TurnstileError):
    """An MCP server cannot be started or reached, or its session broke; retrying
    may help (the session is reopened)."""

    error_type = "MCPServerUnavailable"


# --- the user ---------------------------------------------------------------
class ConversationOwnershipError(TurnstileError):
    """A turn named a conversation that belongs to another user."""

    error_type = "ConversationNotOwned"


class ConversationBusy(TurnstileError):
    """Another turn of the conversation is running; this one waits (retryable)."""

    error_type = "ConversationBusy"


class TemplateVariableMissing(TurnstileError):
    error_type = "TemplateVariableMissing"


# --- the model --------------------------------------------------------------
class ModelRequestRejected(TurnstileError):
    """The provider refused the request (4xx other than 429): retrying cannot help."""

    error_type = "ModelRequestRejected"


class ModelUnavailable(TurnstileError):
    """429/5xx/network: retryable, Temporal owns the retry."""

    error_type = "ModelUnavailable"


class MalformedModelResponse(TurnstileError):
    error_type = "MalformedModelResponse"


class ModelResponseTooLarge(MalformedModelResponse):
    """The response body passed the provider's size limit; it was not read further."""

    error_type = "ModelResponseTooLarge"


class RoundTripCapExceeded(TurnstileError):
    error_type = "RoundTripCapExceeded"

    def __init__(self, cap: int) -> None:
        super().__init__(
            f"the model asked for tools in more than {cap} responses "
            f"(round-trip cap {cap}); the turn was stopped"
        )
        self.cap = cap


class ToolArgumentError(TurnstileError):
    """The model sent arguments that do not fit the tool's schema."""

    error_type = "ToolArgumentError"


class UnknownToolError(TurnstileError):
    error_type = "UnknownTool"


# --- the pipeline's optional steps (docs/pipeline.md) -----------------------
class AttachmentError(TurnstileError):
    """An attachment the turn cannot take (shape, count or inline size)."""

    error_type = "AttachmentError"


class ModerationUnavailable(TurnstileError):
    """The moderator could not give a verdict; `retryable` says whether trying
    again may help (429/5xx/network) or not (a refused request)."""

    error_type = "ModerationUnavailable"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class OutputParseError(TurnstileError):
    """The model's answer did not parse into the service's return type, re-asks included."""

    error_type = "OutputParseError"
