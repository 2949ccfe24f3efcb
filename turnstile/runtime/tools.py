"""Tools are plain typed Python functions.

    @tool(description="...", idempotent=True)
    def querySalesData(ctx: ToolContext, startDate: date, endDate: date,
                       minAmount: Annotated[Decimal, Field(ge=0)]) -> SalesResult: ...

Name, description and JSON schema come from the function: the parameters
(after an optional leading `ToolContext`) become a pydantic model with
`extra="forbid"`, whose JSON schema is what the model sees and whose
validation is the tool's first line of defence. Sync and async functions both
work; sync ones run in a thread so they cannot block the worker's event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, get_type_hints, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    PydanticSchemaGenerationError,
    PydanticUserError,
    TypeAdapter,
    ValidationError,
    create_model,
)

from turnstile.engine.approvals import OutboundPolicy, outbound_findings
from turnstile.engine.equivalence import comparison_form, comparison_key
from turnstile.engine.errors import DuplicateToolError, ToolArgumentError, TurnstileError
from turnstile.engine.flow import FlowRule
from turnstile.engine.safe_text import safe_text, unsafe_text_at
from turnstile.engine.specs import (
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_MAX_ARGUMENT_BYTES,
    DEFAULT_STATEMENT_TIMEOUT_SECONDS,
    RetrySpec,
    ToolSpec,
)
from turnstile.runtime import flow_defaults
from turnstile.stores.effects import made_here

log = logging.getLogger(__name__)


class ToolDefinitionError(TypeError):
    """A tool refused at registration (`@tool`): the message names the tool
    and, for a parameter, the parameter. A TypeError, as before 0.5."""


if TYPE_CHECKING:
    from turnstile.stores.connection import Connection
    from turnstile.stores.db import Database
    from turnstile.stores.transaction import Transaction


@dataclass
class ToolContext:
    """What a running tool may know about the call that runs it."""

    db: Database
    workflow_id: str
    conversation_id: str
    user_id: str
    tool_call_id: str
    attempt: int = 1
    settings: Any = None
    heartbeat: Callable[..., None] = field(default=lambda *a: None)
    # The tool's ToolSpec.statement_timeout_seconds (turnstile.sales.access).
    statement_timeout_seconds: float = DEFAULT_STATEMENT_TIMEOUT_SECONDS
    # The turn's execution chain (Temporal's first_execution_run_id): the same
    # across reset, workflow retry and continue-as-new, new for a new start.
    execution_chain: str = ""
    # The call journal's transaction of this attempt (turnstile.stores.journal);
    # None outside a turn (a tool called directly).
    journal_tx: Transaction | None = None
    # The tools the call's service offers (empty outside a turn): a result that
    # names a next step names only these (`offers`).
    offered_tools: frozenset[str] = frozenset()

    def made_here(self, idempotency_key: str, conn: Connection | None = None) -> bool:
        """Is `idempotency_key` (another call's `idempotency_key`, as a tool
        stored it with the effect it made) a call of this conversation? For a
        tool that reads or changes an effect by an id: refuse an id this
        conversation did not make. In a turn, the call's result must be in the
        conversation's memory (read on `conn`, or a connection of its own);
        outside a turn (a program calling the tool directly) every key is."""
        if self.journal_tx is None:
            return True
        if conn is not None:
            return made_here(conn, self.conversation_id, idempotency_key)
        with self.db.connect() as own:
            return made_here(own, self.conversation_id, idempotency_key)

    def offers(self, tool_name: str) -> bool:
        """Does the service this call runs in offer `tool_name`? A result text
        names a next step only in terms of tools the model can call."""
        return tool_name in self.offered_tools

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """Where a tool writes its effect to the database. In a turn: the call
        journal's transaction, which then records how the call ended and
        commits once, so the effect and its ledger, audit and memory record
        commit together or not at all. The block is a savepoint: an error
        raised in it undoes the block's statements (and a SET LOCAL made in
        it). Use only this connection for writes inside the block: on
        SQLite the transaction holds the write lock. Outside a turn: a
        transaction of its own, committed at the end of the block."""
        if self.journal_tx is None:
            with self.db.connect() as own:
                yield own
            return
        with self.journal_tx.use() as conn, conn.sa.begin_nested():
            yield conn

    @property
    def idempotency_key(self) -> str:
        """Stable across activity retries, worker crashes and resets: one per
        tool call of one turn. Provider call ids repeat (call_0...), so the key
        also names the turn's execution chain."""
        if self.execution_chain:
            return f"{self.workflow_id}/{self.execution_chain}/{self.tool_call_id}"
        return f"{self.workflow_id}/{self.tool_call_id}"


class ToolExecutionError(TurnstileError):
    """Raise from a tool for an execution failure. `retryable=False` tells
    Temporal not to retry (e.g. the e-mail address is refused for good)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class ToolInterrupted(Exception):
    """Raise from a tool when the call may or may not have taken effect (the
    connection to a remote service broke while the request was in flight). A
    tool that is safe to run twice is retried; any other is settled as
    interrupted, never re-run, exactly like a call whose worker was lost."""


@dataclass
class ToolResult:
    """Return this instead of a plain value to also hand state to later rounds
    and turns: `state` is stored on the tool-result message (attribute
    `turnstile.state`) and read back by tool providers via `ProviderContext`."""

    content: Any
    state: dict[str, Any] = field(default_factory=dict)
    # The tool ran and reports a failure (an MCP result with isError): the model
    # reads `content` as an error result; Temporal does not retry it.
    is_error: bool = False


@dataclass
class Undo:
    """What a compensation may return to say how the undo went. Returning
    anything else means the effect was undone. `undone=False` is the honest
    answer when the effect cannot be removed (an e-mail already delivered):
    memory and the audit log then say the effect remains, and the turn ends
    `compensation_failed` instead of `rolled_back`."""

    description: str
    undone: bool = True


Compensation = Callable[..., Any]

# `@tool(approval=...)`: given the validated arguments (and, when it takes two
# parameters, first the call's ToolContext), why this call needs a reviewer —
# a reason (str), or None (also False or ""): it runs at once. True: a reason
# in general words. Sync (run in a thread) or async.
ApprovalCondition = Callable[..., Any]

REASON_MAX = 500  # characters of a condition's reason kept (history, the pending item)


@dataclass
class Tool:
    fn: Callable[..., Any]
    spec: ToolSpec
    args_model: type[BaseModel]
    takes_context: bool
    compensate: Compensation | None = None
    condition: ApprovalCondition | None = None  # `@tool(approval=...)`
    # `@tool(sensitive=...)` as declared (None: the defaults of an effectful
    # tool apply, turnstile.runtime.flow_defaults; they are known once the
    # compensation is).
    declared_sensitive: dict[str, FlowRule] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def parse_arguments(self, raw: str) -> BaseModel:
        """Validate the model's raw JSON arguments; ToolArgumentError says what to fix."""
        data = decode_arguments(self.name, raw, self.spec.max_argument_bytes)
        try:
            return self.args_model.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}"
                for err in exc.errors(include_url=False)
            )
            raise ToolArgumentError(f"invalid arguments for {self.name}: {problems}") from exc

    def repeat_key(self, args: BaseModel) -> str:
        """The validated call's comparison key (the repeat breaker compares
        these; turnstile.engine.equivalence): "" for a repeatable tool."""
        return "" if self.spec.repeatable else comparison_key(self.name, args)

    def review_forms(self, args: BaseModel) -> dict[str, Any]:
        """The review fields' comparison forms: calls that share one look alike."""
        form = comparison_form(args)
        assert isinstance(form, dict)
        return {f: form[f] for f in self.spec.review_fields if f in form}

    def check_outbound(self, args: BaseModel, policy: OutboundPolicy) -> list[str]:
        """Recipients against the service's allow-list: a refused domain is an
        argument error the model can correct; returns notes for the reviewer."""
        recipients = {f: getattr(args, f) for f in self.spec.recipient_fields
                      if getattr(args, f, None) is not None}
        problems, notes = outbound_findings(policy, recipients)
        if problems:
            raise ToolArgumentError(f"invalid arguments for {self.name}: " + "; ".join(problems))
        return notes

    async def approval_reason(self, ctx: ToolContext, args: BaseModel) -> str | None:
        """Why this call needs a reviewer by the tool's condition, or None. A
        condition that raises asks for a reviewer (fail closed)."""
        if self.condition is None:
            return None
        fn = self.condition
        given = (ctx, args) if _parameter_count(fn) >= 2 else (args,)
        try:
            if inspect.iscoroutinefunction(fn):
                said = await fn(*given)
            else:
                said = await asyncio.to_thread(fn, *given)
        except Exception as exc:
            log.error("the approval condition of tool %s raised %s", self.name,
                      type(exc).__name__, exc_info=exc)
            return safe_text(f"the approval condition of {self.name} raised "
                             f"{type(exc).__name__}: {exc}")[:REASON_MAX]
        if said is None or said is False or said == "":
            return None
        if said is True:
            return f"the approval condition of {self.name} holds"
        return safe_text(str(said))[:REASON_MAX]

    @property
    def runs_in_thread(self) -> bool:
        """A plain function runs in a thread, which no cancel can stop."""
        return not inspect.iscoroutinefunction(self.fn)

    async def invoke(self, ctx: ToolContext, args: BaseModel) -> Any:
        kwargs = {name: getattr(args, name) for name in type(args).model_fields}
        call_args = (ctx,) if self.takes_context else ()
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(*call_args, **kwargs)
        return await asyncio.to_thread(self.fn, *call_args, **kwargs)

    def start(self, ctx: ToolContext, args: BaseModel) -> asyncio.Future[Any]:
        """The running call as a task (subclasses override `invoke`)."""
        return asyncio.ensure_future(self.invoke(ctx, args))

    def compensation(self, fn: Compensation) -> Compensation:
        """Declare the compensation (decorator): fn(ctx, arguments, result) where
        `arguments` is the validated arguments model and `result` the stored
        result (parsed JSON when it parses). Its return value describes the undo."""
        self.compensate = fn
        self.spec.compensation = f"{self.name}.compensate"
        self.spec.sensitive = flow_defaults.effective(self.spec, self.declared_sensitive)
        return fn

    async def undo(self, ctx: ToolContext, args: BaseModel, result: Any) -> Any:
        assert self.compensate is not None
        if inspect.iscoroutinefunction(self.compensate):
            return await self.compensate(ctx, args, result)
        return await asyncio.to_thread(self.compensate, ctx, args, result)


MAX_NUMBER_CHARS = 40  # a JSON number literal longer than this is refused


class _NumberTooLong(ValueError):
    pass


def _bounded_number(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """A `json.loads` number hook that refuses absurd literals (a 5,000-digit
    integer, `1e-1000000` spelled out) before Python converts them."""

    def parse(text: str) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            raise _NumberTooLong(
                f"the number {text[:20]}… has {len(text):,} characters (at most "
                f"{MAX_NUMBER_CHARS}); send an ordinary number")
        return kind(text)

    return parse


def decode_arguments(name: str, raw: str, max_bytes: int) -> dict[str, Any]:
    """The model's raw arguments as a JSON object; ToolArgumentError otherwise
    (too large, not JSON, absurd numbers, nested too deeply, not an object)."""
    size = len(raw.encode("utf-8"))
    if size > max_bytes:
        raise ToolArgumentError(
            f"arguments for {name} are {size:,} bytes, above this tool's limit of "
            f"{max_bytes:,}; send shorter values")
    try:
        data = json.loads(raw, parse_int=_bounded_number(int),
                          parse_float=_bounded_number(float)) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolArgumentError(
            f"arguments for {name} are not valid JSON ({exc.msg} at position "
            f"{exc.pos}); send a JSON object matching the tool's schema"
        ) from exc
    except _NumberTooLong as exc:
        raise ToolArgumentError(f"arguments for {name}: {exc}") from exc
    except RecursionError as exc:
        raise ToolArgumentError(
            f"arguments for {name} are nested too deeply; send a flat JSON object"
        ) from exc
    if not isinstance(data, dict):
        raise ToolArgumentError(
            f"arguments for {name} must be a JSON object, got {type(data).__name__}"
        )
    where = unsafe_text_at(data)
    if where is not None:
        raise ToolArgumentError(
            f"invalid arguments for {name}: {where}: text that cannot be stored, a lone UTF-16 "
            "surrogate (an unpaired \\ud800-\\udfff escape) or NUL (\\u0000); send plain "
            "text")
    return data


class ToolOptions(TypedDict, total=False):
    """`@tool(...)`'s options; each defaults as `tool()` says."""

    name: str  # default: the function's name
    description: str  # default: its docstring
    idempotent: bool
    repeatable: bool  # a second identical call may run (the repeat breaker)
    transactional: bool
    requires_approval: bool  # every call waits for a reviewer
    approval: ApprovalCondition  # a call waits when this returns a reason
    fatal_on_failure: bool
    timeout_seconds: float  # default 60
    heartbeat_seconds: float | None
    retry: RetrySpec
    approval_timeout_seconds: float  # default 3600
    max_result_bytes: int | None
    max_argument_bytes: int
    review_fields: Iterable[str]
    recipient_fields: Iterable[str]
    statement_timeout_seconds: float
    # Information flow (docs/information-flow.md): argument -> rule for values
    # from untrusted content; default for an effectful tool: "review" for its
    # text arguments ({} declares none).
    sensitive: Mapping[str, FlowRule]
    trusted_results: bool  # the tool's results are trusted content (default False)
    # Whole values of its JSON results that are trusted: True (all), or the
    # keys whose values are (e.g. ("sender", "recipient")); default False.
    trusted_values: bool | Sequence[str]


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(fn: None = None, /,
         **options: Unpack[ToolOptions]) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /,
         **options: Unpack[ToolOptions]) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function into a Tool (usable bare or with options)."""

    def build(f: Callable[..., Any]) -> Tool:
        hints = get_type_hints(f, include_extras=True)
        params = list(inspect.signature(f).parameters.values())
        takes_context = bool(params) and hints.get(params[0].name) is ToolContext
        if takes_context:
            params = params[1:]
        fields: dict[str, Any] = {}
        tool_name = options.get("name") or f.__name__
        for p in params:
            if p.name not in hints:
                raise TypeError(f"tool {f.__name__}: parameter {p.name!r} needs a type annotation")
            default = ... if p.default is inspect.Parameter.empty else p.default
            fields[p.name] = (hints[p.name], default)
            _check_parameter(tool_name, p.name, hints[p.name])
        args_model = create_model(
            f"{tool_name}Arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        try:
            schema = args_model.model_json_schema()
        except PydanticUserError as exc:
            raise ToolDefinitionError(
                f"tool {tool_name}: its arguments have no JSON schema for the model "
                f"({exc}); use JSON-friendly types (str, int, float, bool, date, "
                "Decimal, lists, dicts, pydantic models)") from exc
        schema.pop("title", None)
        o = options
        condition = o.get("approval")
        if condition is not None and not callable(condition):
            raise ToolDefinitionError(f"tool {tool_name}: approval= takes a function of the "
                                      f"arguments returning a reason or None, not {condition!r}")
        if condition is not None and o.get("requires_approval"):
            raise ToolDefinitionError(
                f"tool {tool_name}: requires_approval=True asks for every call; approval=... "
                "asks when it returns a reason: give one of them")
        description = o.get("description") or inspect.getdoc(f)
        if not description:
            log.warning("tool %s has no description (no docstring, no description=): the "
                        "model sees only its name", tool_name)
        spec = ToolSpec(
            name=tool_name,
            description=description or tool_name,
            parameters=schema,
            idempotent=o.get("idempotent", False),
            repeatable=o.get("repeatable", False),
            transactional=o.get("transactional", False),
            requires_approval=o.get("requires_approval", False),
            approval_condition=condition is not None,
            fatal_on_failure=o.get("fatal_on_failure", False),
            start_to_close_seconds=o.get("timeout_seconds", 60.0),
            heartbeat_seconds=o.get("heartbeat_seconds", DEFAULT_HEARTBEAT_SECONDS),
            retry=o.get("retry") or RetrySpec(),
            approval_timeout_seconds=o.get("approval_timeout_seconds", 3600.0),
            max_result_bytes=o.get("max_result_bytes"),
            max_argument_bytes=o.get("max_argument_bytes", DEFAULT_MAX_ARGUMENT_BYTES),
            review_fields=list(o.get("review_fields", ())),
            recipient_fields=list(o.get("recipient_fields", ())),
            statement_timeout_seconds=o.get("statement_timeout_seconds",
                                            DEFAULT_STATEMENT_TIMEOUT_SECONDS),
        )
        declared = o.get("sensitive")
        if declared is not None:
            problem = flow_defaults.declaration_problem(tool_name, declared, fields)
            if problem:
                raise ToolDefinitionError(problem)
            declared = dict(declared)
        spec.trusted_results = bool(o.get("trusted_results", False))
        vouched = o.get("trusted_values", False)
        problem = flow_defaults.trusted_values_problem(tool_name, vouched, spec.trusted_results)
        if problem:
            raise ToolDefinitionError(problem)
        spec.trusted_values = flow_defaults.trusted_values(vouched)
        spec.sensitive = flow_defaults.effective(spec, declared)
        unknown = [f for f in (*spec.review_fields, *spec.recipient_fields) if f not in fields]
        if unknown:
            raise TypeError(f"tool {tool_name}: review/recipient fields {unknown} are not "
                            "parameters")
        return Tool(fn=f, spec=spec, args_model=args_model, takes_context=takes_context,
                    condition=condition, declared_sensitive=declared)

    return build(fn) if fn is not None else build


def _parameter_count(fn: Callable[..., Any]) -> int:
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return 1


def _check_parameter(tool_name: str, name: str, annotation: Any) -> None:
    """A parameter pydantic can validate and describe, or ToolDefinitionError
    naming the tool and the parameter (not pydantic's own error, which names
    neither)."""
    try:
        TypeAdapter(annotation).json_schema()
    except (PydanticSchemaGenerationError, PydanticUserError) as exc:
        kind = getattr(annotation, "__name__", None) or repr(annotation)
        raise ToolDefinitionError(
            f"tool {tool_name}: parameter {name!r} has type {kind}, which a model cannot "
            "send as JSON (no validation or JSON schema for it); use JSON-friendly types "
            "(str, int, float, bool, date, Decimal, Literal, lists, dicts, pydantic models)"
        ) from exc


class ToolRegistry:
    """Tools by name. A duplicate name fails here, at registration."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, t: Tool) -> Tool:
        if t.name in self._tools:
            raise DuplicateToolError(f"a tool named {t.name!r} is already registered")
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)


def result_to_text(result: Any) -> str:
    """The text the model reads for a tool's return value (lone surrogates and
    NUL replaced: no payload or database could hold them)."""
    if isinstance(result, ToolResult):
        return result_to_text(result.content)
    if isinstance(result, str):
        return safe_text(result)
    if isinstance(result, BaseModel):
        return safe_text(result.model_dump_json(by_alias=True))
    return safe_text(json.dumps(result, default=str, ensure_ascii=False))
