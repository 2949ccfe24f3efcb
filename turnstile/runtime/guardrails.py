"""Guardrails: service callables that judge the user message (step 7) and
the answer (step 15). They run in activities (`turnstile.input_guardrails`,
`turnstile.output_guardrails`), never in workflow code.

A guardrail is any callable taking a context and returning (or awaiting) a
`GuardrailResult`:

- pass      — nothing to say; the next guardrail runs
- fail      — the text is refused; the chain goes on so every failure is reported
- fatal     — refused and the chain stops; the turn's completed tools are compensated
- retry     — (output only) ask the model again with the same messages
- reprompt  — (output only) ask again with `guidance` appended as a user message

Retry, reprompt and fatal stop the chain: the next answer is checked by every
guardrail again. Input guardrails cannot ask the model anything, so a retry or
reprompt from one counts as fail.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from turnstile.engine.callables import invoke
from turnstile.engine.errors import TurnstileError
from turnstile.engine.pipeline_spec import GuardrailVerdict, Outcome


@dataclass(frozen=True)
class AttachmentInfo:
    """An attachment as guardrails see it: no inline data."""

    type: str
    mime_type: str | None
    url: str | None  # None for inline data
    chars: int


@dataclass(frozen=True)
class InputGuardrailContext:
    conversation_id: str
    user_id: str
    service: str
    message: str  # the final user message: templated, augmented by retrieval
    raw_message: str  # the turn input's message as the user sent it
    variables: dict[str, Any] = field(default_factory=dict)
    attachments: list[AttachmentInfo] = field(default_factory=list)


@dataclass(frozen=True)
class OutputGuardrailContext:
    conversation_id: str
    user_id: str
    service: str
    answer: str
    user_message: str
    raw_message: str
    attempt: int = 0  # 0 for the first answer, +1 per re-ask


class GuardrailResult(BaseModel):
    outcome: Outcome = "pass"
    message: str = ""
    guidance: str = ""

    @classmethod
    def passed(cls) -> GuardrailResult:
        return cls()

    @classmethod
    def fail(cls, message: str) -> GuardrailResult:
        return cls(outcome="fail", message=message)

    @classmethod
    def fatal(cls, message: str) -> GuardrailResult:
        return cls(outcome="fatal", message=message)

    @classmethod
    def retry(cls, message: str) -> GuardrailResult:
        return cls(outcome="retry", message=message)

    @classmethod
    def reprompt(cls, message: str, guidance: str) -> GuardrailResult:
        return cls(outcome="reprompt", message=message, guidance=guidance)


GuardrailContext = InputGuardrailContext | OutputGuardrailContext
Guardrail = Callable[[Any], "GuardrailResult | Awaitable[GuardrailResult]"]


def component_name(g: object) -> str:
    return str(getattr(g, "name", None) or getattr(g, "__name__", None) or type(g).__name__)


class GuardrailError(TurnstileError):
    """A guardrail raised instead of returning a result (a bug or an outage)."""


async def run_chain(guardrails: Sequence[Guardrail], ctx: GuardrailContext) -> GuardrailVerdict:
    """Run guardrails in order with the semantics in the module docstring."""
    may_reask = isinstance(ctx, OutputGuardrailContext)
    failures: list[tuple[str, str]] = []
    for g in guardrails:
        name = component_name(g)
        try:
            result = await invoke(g, ctx)
        except Exception as exc:  # any error of a service callable is reported as its own
            raise GuardrailError(f"guardrail {name!r} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, GuardrailResult):
            raise GuardrailError(f"guardrail {name!r} returned {type(result).__name__}, "
                                 "not a GuardrailResult")
        outcome = result.outcome
        if outcome in ("retry", "reprompt") and not may_reask:
            outcome = "fail"
        if outcome == "pass":
            continue
        if outcome == "fail":
            failures.append((name, result.message))
            continue
        return GuardrailVerdict(outcome=outcome, guardrail=name, message=result.message,
                                guidance=result.guidance,
                                failures=[f"{n}: {m}" for n, m in failures])
    if failures:
        return GuardrailVerdict(outcome="fail", guardrail=failures[0][0],
                                message=" ".join(m for _, m in failures),
                                failures=[f"{n}: {m}" for n, m in failures])
    return GuardrailVerdict()


def _text(ctx: GuardrailContext, scope: str) -> str:
    if isinstance(ctx, OutputGuardrailContext):
        return ctx.answer
    return ctx.raw_message if scope == "raw" else ctx.message


# --- guardrails that ship with Turnstile ------------------------------------
@dataclass
class MaxLength:
    """Input: refuse a message longer than `max_chars` (the user's own words by
    default; scope "message" counts the final message with retrieved text).
    Output: reprompt for a shorter answer."""

    max_chars: int = 4000
    scope: Literal["raw", "message"] = "raw"
    name: str = "max_length"

    def __call__(self, ctx: GuardrailContext) -> GuardrailResult:
        text = _text(ctx, self.scope)
        if len(text) <= self.max_chars:
            return GuardrailResult.passed()
        if isinstance(ctx, OutputGuardrailContext):
            return GuardrailResult.reprompt(
                f"the answer has {len(text)} characters (limit {self.max_chars})",
                f"Your answer is too long. Answer again in at most {self.max_chars} characters.")
        return GuardrailResult.fail(
            f"Your message has {len(text)} characters; the limit is {self.max_chars}. "
            "Please shorten it.")


@dataclass
class PatternGuardrail:
    """Matches case-insensitive regular expressions: the first match decides
    `outcome` with `message` (and `guidance` for a reprompt)."""

    name: str
    patterns: Sequence[str]
    message: str
    outcome: Outcome = "fail"
    guidance: str = ""
    scope: Literal["raw", "message"] = "raw"

    def __post_init__(self) -> None:
        self._compiled = [re.compile(p, re.IGNORECASE) for p in self.patterns]

    def __call__(self, ctx: GuardrailContext) -> GuardrailResult:
        text = _text(ctx, self.scope)
        if any(p.search(text) for p in self._compiled):
            return GuardrailResult(outcome=self.outcome, message=self.message,
                                   guidance=self.guidance)
        return GuardrailResult.passed()


INJECTION_PATTERNS = (
    r"\b(ignore|disregard|forget|override)\b.{0,40}\b(previous|prior|above|earlier|all|your)\b"
    r".{0,20}\b(instructions?|prompts?|rules|directions)\b",
    r"\b(reveal|print|show|repeat|output)\b.{0,30}\b(system|hidden|initial)\s+"
    r"(prompt|message|instructions?)\b",
    r"\byou\s+are\s+now\s+(in\s+)?(dan|developer\s+mode|jailbroken|unrestricted)\b",
    r"\bpretend\s+(that\s+)?you\s+have\s+no\s+(rules|restrictions|guidelines)\b",
)


def prompt_injection_guardrail(outcome: Outcome = "fail") -> PatternGuardrail:
    """Input guardrail for the common instruction-override phrasings. It reads
    the user's raw words: retrieved documents are the service's own text."""
    return PatternGuardrail(
        name="prompt_injection", patterns=INJECTION_PATTERNS, outcome=outcome,
        message="This request looks like an attempt to override the assistant's "
                "instructions, so it was not run.")


_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
_NATIONAL_ID = re.compile(r"\b\d{3}-\d{2}-\d{4}\b")  # US SSN shape
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b")


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def find_pii(text: str) -> list[str]:
    """Kinds of personal data in `text`: payment card numbers (Luhn-checked,
    so order numbers rarely match), SSN-shaped ids, IBANs. E-mail addresses
    are not flagged: the sales scenario needs them."""
    kinds = []
    if any(luhn_ok(re.sub(r"\D", "", m.group(0))) for m in _CARD.finditer(text)):
        kinds.append("payment card number")
    if _NATIONAL_ID.search(text):
        kinds.append("national id number")
    if _IBAN.search(text):
        kinds.append("bank account number (IBAN)")
    return kinds


@dataclass
class PiiGuardrail:
    """Input: refuse messages carrying personal data (fail). Output: reprompt
    the model to answer without it."""

    name: str = "pii"
    scope: Literal["raw", "message"] = "raw"

    def __call__(self, ctx: GuardrailContext) -> GuardrailResult:
        kinds = find_pii(_text(ctx, self.scope))
        if not kinds:
            return GuardrailResult.passed()
        what = ", ".join(kinds)
        if isinstance(ctx, OutputGuardrailContext):
            return GuardrailResult.reprompt(
                f"the answer contains a {what}",
                f"Your answer contains a {what}. Answer again without it.")
        return GuardrailResult.fail(
            f"Your message contains a {what}. Please remove it and send the message again; "
            "nothing was sent to the model.")
