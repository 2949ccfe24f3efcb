"""The door of the reviewers' decisions (docs/approvals.md): what an
`approve`/`reject` signal or a `review` update must carry, read by the
product from the raw payload — never dropped by the SDK's decoder.

Pure functions: the workflow (workflows/decisions.py) reads every payload
with them; one that breaks a rule is a refused decision (in the status
query's refused signals and the audit log), except what would make history
grow: a `review` update over the size limits is refused by its validator,
before it enters history.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from turnstile.engine.grant_models import GrantRequest
from turnstile.engine.grant_rules import read_request
from turnstile.engine.safe_text import safe_text, unsafe_text_at
from turnstile.engine.turn_input_rules import ID_MAX, shown

# A note, comment or reason: the `review` update refuses a longer one (its
# validator: the payload never enters history); a signal's is cut to it.
DECISION_NOTE_MAX = 2_000
# A decision's whole payload, edited arguments included (each tool also
# bounds its arguments: ToolSpec.max_argument_bytes, 64 KiB by default). The
# update refuses a larger one; a larger signal is refused unread.
DECISION_PAYLOAD_MAX = 256 * 1024
# What the turn keeps of refusals: the last REFUSALS_KEPT texts (each at most
# REFUSAL_TEXT_MAX characters) and their total count.
REFUSALS_KEPT = 100
# A tool call id as a decision names it (the model's ids have no fixed length).
CALL_ID_MAX = 1_000
REFUSAL_TEXT_MAX = 600


class DecisionKind(StrEnum):
    APPROVE = "approve"  # signal ApproveSignal
    REJECT = "reject"  # signal RejectSignal
    REVIEW = "review"  # update ReviewInput


_NOTE_FIELD = {DecisionKind.APPROVE: "comment", DecisionKind.REJECT: "reason",
               DecisionKind.REVIEW: "note"}
_FIELDS = {
    DecisionKind.APPROVE: {"tool_call_id", "reviewer", "comment", "arguments",
                           "arguments_digest", "grant"},
    DecisionKind.REJECT: {"tool_call_id", "reviewer", "reason", "arguments_digest"},
    DecisionKind.REVIEW: {"tool_call_id", "reviewer", "approved", "note", "arguments",
                          "arguments_digest", "grant"},
}


@dataclass(frozen=True)
class DecisionRequest:
    """A decision as read from its payload (not yet checked against the turn)."""

    kind: DecisionKind
    tool_call_id: str
    reviewer: str
    approved: bool
    note: str
    arguments: dict[str, Any] | None = None  # the reviewer's complete edited arguments
    digest: str | None = None  # the PendingApproval.arguments_digest the reviewer saw
    # A standing approval the reviewer issues with the approval (docs/approvals.md).
    grant: GrantRequest | None = None

    @property
    def verb(self) -> str:
        return "approve" if self.approved else "reject"


@dataclass(frozen=True)
class Unreadable:
    """A payload that is no decision, and what could be read of it."""

    verb: str
    tool_call_id: str
    reviewer: str
    reason: str


def _text(value: Any, limit: int = 200) -> str:
    """What a refusal may quote of a value that should have been a string."""
    return safe_text(value)[:limit] if isinstance(value, str) else ""


def read_decision(kind: DecisionKind, value: Any, *, size: int = 0,
                  cut_note: bool = True) -> DecisionRequest | Unreadable:
    """The decision `value` (a decoded payload of `size` bytes) asks for, or
    why it is none. `cut_note`: a note over DECISION_NOTE_MAX is cut (a
    signal's) instead of refused."""
    verb = "reject" if kind is DecisionKind.REJECT else "approve"
    if isinstance(value, dict) and kind is DecisionKind.REVIEW and value.get("approved") is False:
        verb = "reject"
    call_id = _text(value.get("tool_call_id")) if isinstance(value, dict) else ""
    reviewer = _text(value.get("reviewer")) if isinstance(value, dict) else ""

    def unreadable(reason: str) -> Unreadable:
        return Unreadable(verb=verb, tool_call_id=call_id, reviewer=reviewer,
                          reason=f"unreadable {kind.value} payload: {reason}")

    if size > DECISION_PAYLOAD_MAX:
        return unreadable(f"{size} bytes, over the limit of {DECISION_PAYLOAD_MAX}")
    if not isinstance(value, dict):
        return unreadable(f"expected a JSON object, got {_kind(value)}")
    unknown = sorted(str(k) for k in value if k not in _FIELDS[kind])
    if unknown:  # a misspelt "arguments" must not approve the model's call
        return unreadable(f"unknown field(s) {', '.join(shown(k, 40) for k in unknown[:5])} "
                          f"(allowed: {', '.join(sorted(_FIELDS[kind]))})")
    problems: list[str] = []
    for field, limit in (("tool_call_id", CALL_ID_MAX), ("reviewer", ID_MAX)):
        got = value.get(field)
        if not isinstance(got, str):
            problems.append(f"{field} must be a string, got {_kind(got)}")
        elif len(got) > limit:
            problems.append(f"{field} is {len(got)} characters, over the limit of {limit}")
    note_field = _NOTE_FIELD[kind]
    note = value.get(note_field, "")
    if not isinstance(note, str):
        problems.append(f"{note_field} must be a string, got {_kind(note)}")
        note = ""
    elif len(note) > DECISION_NOTE_MAX and not cut_note:
        problems.append(f"{note_field} is {len(note)} characters, over the limit of "
                        f"{DECISION_NOTE_MAX}")
    approved = kind is DecisionKind.APPROVE
    if kind is DecisionKind.REVIEW:
        got = value.get("approved")
        if not isinstance(got, bool):
            problems.append(f"approved must be true or false, got {_kind(got)}")
        approved = got is True
    arguments = value.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        problems.append(f"arguments must be a JSON object (the complete edited arguments), "
                        f"got {_kind(arguments)}")
    elif arguments is not None and (where := unsafe_text_at(arguments)) is not None:
        problems.append(f"arguments hold text that cannot be stored at {where}")
    digest = value.get("arguments_digest")
    if digest is not None and not isinstance(digest, str):
        problems.append(f"arguments_digest must be a string, got {_kind(digest)}")
    grant = None
    if value.get("grant") is not None:
        read = read_request(value["grant"])
        if isinstance(read, str):
            problems.append(read)
        elif not approved:
            problems.append("a grant comes only with an approval")
        else:
            grant = read
    if problems:
        return unreadable("; ".join(problems))
    return DecisionRequest(kind=kind, tool_call_id=value["tool_call_id"],
                           reviewer=value["reviewer"], approved=approved,
                           note=safe_text(note)[:DECISION_NOTE_MAX],
                           arguments=arguments, digest=digest[:200] if digest else None,
                           grant=grant)


def oversize(kind: DecisionKind, value: Any, size: int) -> str | None:
    """Why a `review` update is refused before it enters history (None: it
    is accepted, and any other problem is refused and audited by the turn)."""
    if size > DECISION_PAYLOAD_MAX:
        return (f"the {kind.value} payload is {size} bytes, over the limit of "
                f"{DECISION_PAYLOAD_MAX}")
    note = value.get(_NOTE_FIELD[kind]) if isinstance(value, dict) else None
    if isinstance(note, str) and len(note) > DECISION_NOTE_MAX:
        return (f"the {_NOTE_FIELD[kind]} is {len(note)} characters, over the limit of "
                f"{DECISION_NOTE_MAX}")
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null (or nothing)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
