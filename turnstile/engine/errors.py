"""Typed errors. Each names who is at fault: configuration, the model, the user,
or the environment. `error_type` is the stable name that appears in a turn's
`error.type` and in Temporal ApplicationError types; never rename one."""

from __future__ import annotations

from enum import StrEnum


class TurnstileError(Exception):
    """`error_type` defaults to the class name; a class whose stable name
    predates it spells the name out (never rename either)."""

    error_type = "TurnstileError"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "error_type" not in cls.__dict__:
            cls.error_type = cls.__name__


# --- configuration (the developer's fault; fails at registration) ----------
class ConfigurationError(TurnstileError):
    error_type = "ConfigurationError"


class DuplicateToolError(ConfigurationError):
    error_type = "DuplicateToolError"


class NoCompensation(ConfigurationError):
    """A compensation was asked of a tool that declares none (the service changed)."""


class NotInWorkflow(ConfigurationError):
    """A Turnstile activity was run outside an AgentTurn workflow."""


class UnknownServiceError(TurnstileError):
    error_type = "UnknownService"


# --- the environment --------------------------------------------------------
class DatabaseUnavailable(TurnstileError):
    """The database cannot be reached; retrying may help."""

    error_type = "DatabaseUnavailable"


class MemoryConflictError(TurnstileError):
    """Another writer holds a memory slot this turn tried to write."""

    error_type = "MemoryConflict"


class CallTakenOver(TurnstileError):
    """A tool attempt found its call claimed by a later attempt (the server
    gave up on this one, e.g. after a heartbeat timeout, and started
    another): what this attempt did is not recorded, its journal
    transaction rolls back."""


class CallNotRecorded(TurnstileError):
    """Recording how a tool call ended failed at the database: nothing of the
    attempt was kept (the tool's effect neither, when the tool wrote it in
    the call journal's transaction); retrying may help."""


class MCPServerUnavailable(TurnstileError):
    """An MCP server cannot be started or reached, or its session broke; retrying
    may help (the session is reopened)."""

    error_type = "MCPServerUnavailable"


# --- the user ---------------------------------------------------------------
class DatabaseRefusedData(TurnstileError):
    """The database refused a value (a driver DataError, a NOT NULL or CHECK
    violation): the same data fails the same way on every retry."""


class ConversationOwnershipError(TurnstileError):
    """A turn named a conversation that belongs to another user."""

    error_type = "ConversationNotOwned"


class InvalidTurnInput(TurnstileError):
    """A turn's input breaks a rule of the door (turnstile.engine.turn_input_rules):
    an id outside its character set or length, a message with text no store can
    hold or over its length. The turn ends `refused` before it holds anything."""


class MessageTooLong(TurnstileError):
    """The user's message alone takes more tokens than the model can read
    (its context size, less the tools and response format the request
    carries). The turn ends `refused` before the message is stored or sent:
    no window could make the request one the endpoint accepts."""


# Errors that mean "this turn may not run", not "it failed": a turn an
# activity stops with one of these ends `refused` (workflows/state.py).
REFUSING_ERRORS = frozenset({"MessageTooLong", "BudgetExceeded", "NewMessageRefused"})


class BudgetExceeded(TurnstileError):
    """The user's model tokens (prompt + completion) since UTC midnight have
    reached TURNSTILE_DAILY_TOKEN_BUDGET: checked before each model call, the
    call is not made and the turn ends `refused`. Retrying cannot help today."""

    @classmethod
    def spent(cls, user_id: str, used: int, budget: int) -> BudgetExceeded:
        """The error with its figures: "user alice used 12,345 of 10,000 tokens today"."""
        return cls(f"user {user_id} used {used:,} of {budget:,} tokens today")


class DecisionRefused(TurnstileError):
    """A reviewer's decision that may not be applied (self-approval, not an
    approver, already decided, no such pending call, no reviewer named).
    The `review` update's failure carries a RefusalKind as its details."""


class RefusalKind(StrEnum):
    """Which refusal a decision met, as the `review` update's failure details
    carry it: a caller tells them apart by this, never by the message."""

    ALREADY_DECIDED = "already_decided"  # another decision on the call took effect first
    REFUSED = "refused"  # any other reason (the message says which)


class ConversationBusy(TurnstileError):
    """Another turn of the conversation is running; this one waits (retryable).
    `queued_behind`: "queued behind turn X" (", waiting for an approval" when
    X is parked on one), for the waiting turn's status (docs/steering.md)."""

    error_type = "ConversationBusy"

    def __init__(self, message: str, queued_behind: str = "") -> None:
        super().__init__(message)
        self.queued_behind = queued_behind


class NewMessageRefused(TurnstileError):
    """A new turn arrived while the conversation's turn waits for an approval,
    and the service's `on_new_message` is "refuse": the new turn ends
    `refused` at once, holding nothing (docs/steering.md)."""


class TurnSteered(TurnstileError):
    """The turn waited for an approval when the user sent a new message
    (`on_new_message="steer"`): its waiting calls were rejected with the
    reason "the user sent a new message" and it ended `steered` without
    asking the model again; the new turn continues (docs/steering.md)."""


class RunSuperseded(TurnstileError):
    """A run that is no longer its workflow's current run (a reset replaced
    it, or it ended) tried to write to its conversation; its writes are
    refused, so two runs of a turn never interleave. Retrying cannot help."""


class ResetConflict(TurnstileError):
    """A reset run would take back messages the conversation has built on
    since (a later turn wrote after them, or holds the conversation): the
    reset is refused, nothing is superseded and nothing is rolled back."""


class TemplateVariableMissing(TurnstileError):
    error_type = "TemplateVariableMissing"


# --- the model --------------------------------------------------------------
class ModelRequestRejected(TurnstileError):
    """The provider refused the request (4xx other than 429): retrying cannot help."""

    error_type = "ModelRequestRejected"


class ModelFunctionError(ModelRequestRejected):
    """A model that is a Python function (turnstile.testing.FunctionModel, a
    service's offline model) raised: the message names the function and the
    file, line and code of the user's own frame where it raised; the log has
    the traceback. Not retried: the same request raises again."""

    error_type = "ModelFunctionError"


class ModelUnavailable(TurnstileError):
    """429/5xx/network: retryable, Temporal owns the retry."""

    error_type = "ModelUnavailable"


class ModelServerRefused(TurnstileError):
    """The model server answered a 5xx whose body says the request is invalid
    (a validation error), the same answer `MODEL_REFUSAL_LIMIT` times in a
    row: the request, not the server, is the problem, so retrying cannot
    help (activities/model_refusals.py; docs/errors.md)."""

    error_type = "ModelServerRefused"


class MalformedModelResponse(TurnstileError):
    error_type = "MalformedModelResponse"


class ModelOutputUnparsed(MalformedModelResponse):
    """The model server could not read what the model wrote in its own reply
    format and answered 5xx instead of a reply: llama-server's 500 "The model
    produced output that does not match the expected ... format" (a reply cut
    at `max_tokens` inside a `response_format` JSON, or text its chat
    template's tool-call parser cannot read), older builds' "Failed to parse
    input at pos N". The model's text is not in the answer, so there is
    nothing to read back; not retried (the request asks the same model the
    same thing again), the turn ends `failed` naming the server's message."""

    error_type = "ModelOutputUnparsed"


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


class BreakerTripped(TurnstileError):
    """A circuit breaker stopped the turn; the subclass says which."""


class TooManyToolCalls(BreakerTripped):
    """More tool executions in one turn than the breaker allows ("task too complex")."""


class LoopDetected(BreakerTripped):
    """The model alternated between two tools more often than the breaker allows."""


class ToolArgumentError(TurnstileError):
    """The model sent arguments that do not fit the tool's schema."""

    error_type = "ToolArgumentError"


class UnknownToolError(TurnstileError):
    """The model called a tool the service does not have (policy `on_unknown_tool: fail`)."""

    error_type = "UnknownTool"


class ToolCallRejected(TurnstileError):
    """A reviewer (or the approval deadline) rejected a call (policy `on_rejection: fail`)."""


class FatalToolFailure(TurnstileError):
    """A tool declared `fatal_on_failure` failed after its retries: the task cannot be done."""


class TurnCancelled(TurnstileError):
    """The turn was cancelled (`temporal workflow cancel`); its effects are undone."""


# --- the pipeline's optional steps (docs/pipeline.md) -----------------------
class AttachmentError(TurnstileError):
    """An attachment the turn cannot take (shape, count or inline size)."""

    error_type = "AttachmentError"


class SystemTransformerError(TurnstileError):
    """The service's system-message transformer raised or returned a non-string (step 2)."""


class RetrievalError(TurnstileError):
    """The service's retriever raised (step 5)."""


class ModerationUnavailable(TurnstileError):
    """The moderator could not give a verdict; `retryable` says whether trying
    again may help (429/5xx/network) or not (a refused request)."""

    error_type = "ModerationUnavailable"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class InputGuardrailFailed(TurnstileError):
    """An input guardrail refused the message (`fail`)."""


class InputGuardrailFatal(TurnstileError):
    """An input guardrail refused the message as fatal."""


class OutputGuardrailFailed(TurnstileError):
    """An output guardrail refused the answer (`fail`): the answer is refused, the work kept."""


class OutputGuardrailFatal(TurnstileError):
    """An output guardrail refused the answer as fatal: completed tool effects are undone."""


class OutputGuardrailRetriesExhausted(TurnstileError):
    """An output guardrail still refused the answer after the bounded re-asks."""


class ModerationFlagged(TurnstileError):
    """Moderation flagged the user's message; nothing of it is answered."""


class AnswerTruncated(TurnstileError):
    """The answer hit the model's length limit, its one continuation too (status truncated)."""

    error_type = "AnswerTruncated"


class ContentFiltered(TurnstileError):
    """The provider's content filter withheld the answer (status moderated)."""

    error_type = "ContentFiltered"


class EmptyAnswer(TurnstileError):
    """The model's final answer was empty (or only whitespace), with no tool
    calls, and still empty when asked once more without tools (status failed;
    turnstile.engine.answer_rules). The work done before it is kept."""


class ToolCallAsText(TurnstileError):
    """The model wrote a call of an offered tool as text (a JSON block naming
    it) instead of calling it: nothing was run (status failed). Usually the
    server's chat template or tool-call parser does not suit the model."""


class DeadEndCalls(TurnstileError):
    """The model kept making calls that cannot run — a tool that needs
    arguments called with none, a tool the breaker disabled, a tool that does
    not exist, a call written as text that does not parse — and was asked
    once for its answer without tools, and made such a call again (status
    failed; turnstile.engine.dead_ends). The message names what it kept
    doing; the work done before it is kept."""


class FabricatedToolResult(TurnstileError):
    """The model's final answer wrote a tool result itself (a
    `<tool_response>` block, a `Result of NAME [call ID]:` line, ...), so it
    tells of an effect or a value no tool returned, and it wrote one again
    when asked once more without tools (status failed, from revision 9;
    turnstile.engine.answer_rules). The message names what it wrote; the
    answer is not given, the work done before it is kept."""


class OutputParseError(TurnstileError):
    """The model's answer did not parse into the service's return type, re-asks included."""

    error_type = "OutputParseError"


# --- the product's own code or data it cannot read ---------------
class UnexpectedError(TurnstileError):
    """An exception no part of the turn handles escaped workflow code (a bug,
    or data of a shape the code does not expect): the turn ends `failed` with
    this type, naming the step (`TurnErrorInfo.step`) and the exception class
    (`TurnErrorInfo.exception`), instead of retrying its workflow task forever
    while it holds its conversation (workflows/agent_turn.py)."""


class IllegalTransition(TurnstileError):
    """A move the turn's state machine does not allow from the phase the turn
    is in (turnstile.engine.turn_machine.TRANSITIONS): a bug of the workflow
    code. Raised in the turn's own code, it ends the turn `failed` with
    `UnexpectedError` naming the phase and this error, as any unexpected
    exception does (workflows/agent_turn.py): never a hang."""


class UnreadableData(TurnstileError):
    """An activity met data no retry can read: a value that fails its type
    (pydantic validation), text that cannot be decoded or encoded, a value of
    the wrong type or shape (TypeError, KeyError, ValueError). The activity
    fails at once, not retried; the message names the activity and what it
    could not read (activities/errors.py)."""


class DamagedRow(UnreadableData):
    """A stored row of a conversation that the product cannot read as what it
    is: text that is not UTF-8 (SQLite), JSON that does not parse or has the
    wrong shape, a role or type no message has, text no store can hold (NUL,
    lone surrogates). The same row fails every read, so the turn ends at once
    (not retried) and the message names the conversation and the row's `seq`;
    `python starter.py check` lists it (`damaged: ...`) and `python starter.py
    conversation quarantine CONVERSATION_ID SEQ` sets it aside (docs/operating.md)."""

    def __init__(self, conversation_id: str, seq: int | None = None,
                 what: str = "a value it cannot read", table: str = "chat_message") -> None:
        self.conversation_id, self.seq, self.what, self.table = conversation_id, seq, what, table
        if seq is None:
            text = f"conversation {conversation_id} has a damaged row in {table}: {what}"
        else:
            text = (f"conversation {conversation_id} has a damaged row in {table} (seq {seq}): "
                    f"{what}; set it aside with `starter.py conversation quarantine "
                    f"{conversation_id} {seq}`")
        super().__init__(text)
