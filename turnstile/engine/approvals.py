"""Who may decide an approval, and where outbound messages may go — policy
as data, checked by pure functions (workflow code checks decisions; the
worker checks recipients before a reviewer is asked and again before a tool
runs).

The approver policy travels in the `ServiceSpec` (so a turn's history records
the policy it applied). Default, when a service names no approvers: any named
reviewer except the user who started the turn.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import re
from collections.abc import Mapping
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from turnstile.engine import identity, identity_lowercased
from turnstile.engine.contract import ApprovalDecision
from turnstile.engine.identity import legacy_name_key, prepared
from turnstile.engine.messages import ToolCall

ANY_TOOL = "*"


def canonical_json(args: Any) -> str:
    """One spelling of a call's arguments: sorted keys, no spaces, text as is."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def arguments_digest(args: Any) -> str:
    """`PendingApproval.arguments_digest`: sha256 hex of the arguments'
    canonical JSON (UTF-8), what a decision names to be bound to what the
    reviewer saw (docs/approvals.md)."""
    return hashlib.sha256(canonical_json(args).encode("utf-8", "surrogatepass")).hexdigest()


class ApprovalPolicy(BaseModel):
    # Tool name (or "*") -> the reviewers allowed to decide its calls. A tool
    # with no entry (and no "*") may be decided by any named reviewer.
    reviewers: dict[str, list[str]] = Field(default_factory=dict)
    allow_self_approval: bool = False  # may the requester decide their own call?


class NameRule(Enum):
    """How a decision compares names: today's rule, or the rule a turn that
    decided earlier followed (its replay must take the same decision)."""

    SPELLING = "spelling"  # before v0.3: as typed, trimmed
    NFKC = "nfkc"  # v0.3: NFKC, case-folded (identity.legacy_name_key)
    # RFC 8265 + UTS #39 of the lower-cased name (identity_lowercased): turns
    # begun before revision 4
    STANDARD = "standard"
    CASE_BLIND = "case-blind"  # the skeleton in every case, text only (identity): revision 4



def approval_refusal(policy: ApprovalPolicy, *, tool: str, reviewer: str,
                     requester: str, by_identity: bool = True,
                     rule: NameRule | None = None) -> str | None:
    """Why `reviewer` may not decide a call of `tool` requested by `requester`;
    None when they may. Names are compared by `rule` (default: today's,
    turnstile.engine.identity: a name that is no identity decides nothing,
    the requester or anyone confusable with them in any case may not decide,
    an approver list admits equal identities only); the earlier rules are
    kept for the replay of turns that decided by them (`by_identity=False`:
    the exact spelling of turns that decided before identities)."""
    rule = rule or (NameRule.CASE_BLIND if by_identity else NameRule.SPELLING)
    shown = repr(reviewer.strip()).encode("ascii", "backslashreplace").decode("ascii")
    allowed = policy.reviewers.get(tool, policy.reviewers.get(ANY_TOOL))
    not_listed = (f"{shown} is not an approver of {tool} "
                  f"(approvers: {', '.join(allowed or []) or 'none'})")
    if rule is NameRule.CASE_BLIND:
        if not prepared(reviewer) and identity.not_text(reviewer) is None:
            return "a decision needs a named reviewer"
        problem = identity.name_problem(reviewer)
        if problem:
            return f"{shown} is {problem}"
        if identity.same_person(reviewer, requester) and not policy.allow_self_approval:
            if identity.is_listed(reviewer, [requester]):
                return f"{shown} requested this call and may not decide it"
            return (f"{shown} is confusable with the requester {_shown(requester)} and "
                    "may not decide this call")
        if allowed is not None and not identity.is_listed(reviewer, allowed):
            return not_listed
        return None
    if rule is NameRule.STANDARD:  # as turns begun before revision 4 decided
        if not prepared(reviewer):
            return "a decision needs a named reviewer"
        problem = identity_lowercased.name_problem(reviewer)
        if problem:
            return f"{shown} is {problem}"
        if identity_lowercased.same_person(reviewer, requester) and not policy.allow_self_approval:
            if identity_lowercased.canonical(reviewer) == identity_lowercased.canonical(requester):
                return f"{shown} requested this call and may not decide it"
            return (f"{shown} is confusable with the requester {requester!r} and may not "
                    "decide this call")
        if allowed is not None and not identity_lowercased.is_listed(reviewer, allowed):
            return not_listed
        return None
    key = legacy_name_key if rule is NameRule.NFKC else str.strip
    name = key(reviewer)
    if not name:
        return "a decision needs a named reviewer"
    if name == key(requester) and not policy.allow_self_approval:
        return f"{shown} requested this call and may not decide it"
    if allowed is not None and name not in {key(a) for a in allowed}:
        return not_listed
    return None


def _shown(name: str) -> str:
    return repr(name).encode("ascii", "backslashreplace").decode("ascii")


class OutboundPolicy(BaseModel):
    """Where a service's tools may send messages: recipient domains on the
    allow-list pass; others are an argument error the model sees, unless
    `allow_external`, in which case the reviewer is told "external recipient"."""

    allowed_domains: list[str] = Field(default_factory=list)  # empty: no restriction
    allow_external: bool = False


def recipient_domain(address: str) -> str:
    return address.rpartition("@")[2].strip().lower().rstrip(".")


_LOCAL = re.compile(r"[A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*")
_DOMAIN = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}\.?")


def recipient_problem(value: str) -> str | None:
    """Why `value` is not one plain mailbox address (None: it is), read with
    the standard library's address parser: exactly one address, no display
    name or comment, a local part of letters, digits and `._+-` (no `%` or `!`
    relaying, no quoted part, no source route) and an ASCII domain (an
    internationalised one in its xn-- form). What the allow-list then checks
    is the domain this address really goes to."""
    shown = repr(value[:80]).encode("ascii", "backslashreplace").decode("ascii")
    found = email.utils.getaddresses([value])
    if len(found) != 1 or not found[0][1]:
        return f"{shown} is not exactly one e-mail address"
    name, address = found[0]
    if name or address != value.strip():
        return f"{shown}: give the bare address, without a name, comment or brackets"
    local, at, domain = address.rpartition("@")
    if not at or not _LOCAL.fullmatch(local) or len(local) > 64:
        return (f"{shown}: the part before @ may hold only letters, digits and . _ + - "
                "(no %, !, quotes or routes)")
    if not _DOMAIN.fullmatch(domain) or len(domain) > 253:
        return f"{shown}: the domain must be an ASCII host name (IDN in its xn-- form)"
    return None


def outbound_findings(policy: OutboundPolicy, recipients: Mapping[str, Any]) -> tuple[
        list[str], list[str]]:
    """(problems, notes) for the recipient fields of one call: problems refuse
    the call, notes are shown to the reviewer."""
    problems: list[str] = []
    notes: list[str] = []
    if not policy.allowed_domains:
        return problems, notes
    allowed = {d.lower().lstrip("@").rstrip(".") for d in policy.allowed_domains}
    for field, value in recipients.items():
        addresses = value if isinstance(value, list) else [value]
        for address in addresses:
            problem = recipient_problem(str(address))
            if problem:
                problems.append(f"{field}: {problem}")
                continue
            domain = recipient_domain(str(address))
            if domain in allowed:
                continue
            if policy.allow_external:
                notes.append(f"external recipient: {field} at {domain}")
            else:
                problems.append(
                    f"{field}: recipient domain {domain!r} is not allowed for this service "
                    f"(allowed: {', '.join(sorted(allowed))})")
    return problems, notes


def changed_fields(before: Any, after: Mapping[str, Any]) -> list[str]:
    """The top-level fields a reviewer's edit changed, added or removed."""
    old = before if isinstance(before, Mapping) else {}
    return sorted(k for k in set(old) | set(after)
                  if k not in old or k not in after or canonical_json(old[k])
                  != canonical_json(after[k]))


def _shown_value(value: Any, limit: int = 300) -> str:
    text = canonical_json(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def edit_note(reviewer: str, before: Any, after: Mapping[str, Any],
              subject: str = "this call's arguments") -> str:
    """What the model is told when a reviewer edited its call before it ran:
    who, and each change (before 0.5 the first line of the call's result in
    memory; since, a note of its own: `note_of_edits`)."""
    old = before if isinstance(before, Mapping) else {}
    changes = []
    for field in changed_fields(before, after):
        if field not in after:
            changes.append(f"{field}: removed (was {_shown_value(old[field])})")
        elif field not in old:
            changes.append(f"{field}: added {_shown_value(after[field])}")
        else:
            changes.append(f"{field}: {_shown_value(old[field])} -> "
                           f"{_shown_value(after[field])}")
    return (f"[The reviewer {reviewer!r} edited {subject} before approving it; "
            f"it ran with the edited arguments. Changes: {'; '.join(changes) or 'none'}.]")


EDIT_NOTE_PREFIX = "[The reviewer "


def recorded_edits(reviewer: str, before: Any, after: Mapping[str, Any]) -> dict[str, Any]:
    """An approval with edits as the call's result message keeps it (attribute
    `turnstile.edited`, beside the tool's own result): who edited, the model's
    arguments, the arguments the tool ran with, and the fields that changed."""
    return {"by": reviewer, "model_arguments": before, "arguments": dict(after),
            "changed": changed_fields(before, after)}


def note_of_edits(edits: Mapping[str, Any], call_id: str, tool_name: str) -> str:
    """The note a wire model reads after the tool results of its round (a
    message of its own, never inside the tool's result): who edited which
    call, and each change."""
    after = edits.get("arguments")
    return edit_note(str(edits.get("by", "")), edits.get("model_arguments"),
                     after if isinstance(after, Mapping) else {},
                     f"the arguments of your call {call_id} ({tool_name})")


def split_edit_note(content: str) -> tuple[str | None, str]:
    """A result stored before 0.5 began with its edit note on a line of its own
    (`edit_note`): (the note, the tool's own result); (None, content) otherwise."""
    if not content.startswith(EDIT_NOTE_PREFIX):
        return None, content
    end = content.find(".]\n")
    if end < 0:
        return None, content
    return content[:end + 2], content[end + 3:]


def ran_call(call: ToolCall, approval: ApprovalDecision | None) -> ToolCall:
    """The call as it runs: `call` itself, or — approved with edits — the
    same call with the reviewer's arguments (the model's stays in memory)."""
    if approval is None or approval.arguments is None:
        return call
    return ToolCall(id=call.id, name=call.name, arguments=canonical_json(approval.arguments))
