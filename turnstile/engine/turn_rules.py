"""Pure helpers of the turn pipeline (deterministic; safe in workflow code)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from turnstile.engine.contract import PendingApproval
from turnstile.engine.errors import TemplateVariableMissing
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.engine.safe_text import has_unsafe_text, safe_text

_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.]*)\s*\}\}")


def render_template(template: str, variables: dict[str, Any]) -> str:
    """Fill `{{name}}` placeholders; a missing variable is a clear error."""
    missing = sorted({m.group(1) for m in _VAR.finditer(template)} - variables.keys())
    if missing:
        raise TemplateVariableMissing(
            f"template needs variable(s) {', '.join(missing)}; pass them in the turn's "
            "`variables`"
        )
    return _VAR.sub(lambda m: str(variables[m.group(1)]), template)


def parsed_arguments(raw: str) -> Any:
    """Arguments for records: the parsed object when it parses, else the raw
    text (also when parsing would put text no payload can hold — a lone
    surrogate or NUL — into the record, or nests too deeply to decode)."""
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return safe_text(raw)
    return safe_text(raw) if has_unsafe_text(parsed) else parsed


# --- what the loop does next (a typed union, not flags) ---
@dataclass(frozen=True)
class FinalAnswer:
    text: str


@dataclass(frozen=True)
class RunTools:
    calls: list[ToolCall]


@dataclass(frozen=True)
class AwaitApproval:
    """A call of the round waits for a reviewer's decision before it runs:
    the loop's interruption (as openai-agents' NextStepInterruption), beside
    a final answer and running tools. The tool round takes this step for a
    call whose tool requires approval once its arguments passed validation
    (`tool_round_rules.approval_step`); the turn's state machine enters
    `awaiting_approval` with it (TurnMachine.await_approval). `pending` is
    what reviewers see; the deadline rejects the call after `timeout_seconds`."""

    call: ToolCall
    pending: PendingApproval
    since: datetime
    timeout_seconds: float


NextStep = FinalAnswer | RunTools | AwaitApproval


def next_step(message: ChatMessage) -> FinalAnswer | RunTools:
    """After a model response: its answer, or its tool calls to run (a call
    that needs approval becomes an `AwaitApproval` in its round)."""
    if message.tool_calls:
        return RunTools(calls=list(message.tool_calls))
    return FinalAnswer(text=message.content or "")

