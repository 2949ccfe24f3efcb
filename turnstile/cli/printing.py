"""What `starter.py` prints: pending approvals, results and tables. Pure
formatting, no I/O but the program's own standard output."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from turnstile.engine.contract import AuditStatus, Handlers, PendingApproval, TurnResult
from turnstile.engine.flow import refusal_reason


def out(text: str = "") -> None:
    """CLI output (this is the program's interface, not a log)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def signal_command(workflow_id: str, p: PendingApproval, reviewer: str,
                   name: Handlers = Handlers.APPROVE) -> str:
    """A command a reviewer can paste: every value shell-quoted, so a hostile
    call id or workflow id is data, never shell code."""
    decision = {"tool_call_id": p.tool_call_id, "reviewer": reviewer}
    if p.arguments_digest:  # bound to what the reviewer saw (refused as stale otherwise)
        decision["arguments_digest"] = p.arguments_digest
    payload = json.dumps(decision)
    return shlex.join(["temporal", "workflow", "signal", "--workflow-id", workflow_id,
                       "--name", name.value, "--input", payload])


def describe_pending(p: PendingApproval) -> list[str]:
    """What a reviewer must see: the fields that matter first, then every
    argument in full (never cut off), then the notes."""
    checked = "validated" if p.validated else "NOT validated yet"
    lines = [f"  waiting for approval of {p.tool_name} (call {p.tool_call_id!r}, "
             f"arguments {checked}, deadline {p.deadline})"]
    if p.reason:
        lines.append(f"    why: {p.reason}")
    for field, value in p.highlights.items():
        lines.append(f"    >> {field}: {json.dumps(value, ensure_ascii=False)}")
    lines.append("    arguments: " + json.dumps(p.arguments, ensure_ascii=False, indent=2)
                 .replace("\n", "\n    "))
    lines += [f"    !! {note}" for note in p.notes]
    lines += similar_lines(p)
    lines += provenance_lines(p)
    if p.arguments_digest:
        lines.append(f"    arguments digest: {p.arguments_digest}")
    return lines


def similar_lines(p: PendingApproval) -> list[str]:
    """The conversation's earlier effects that look like the waiting call
    (newest first): what a reviewer must know before approving another."""
    if not p.similar_effects:
        return []
    lines = [f"    !! {len(p.similar_effects)} earlier call(s) of {p.tool_name} look alike:"]
    for e in p.similar_effects:
        where = "this turn" if e.this_turn else "an earlier turn"
        same = ", SAME EFFECT" if e.same_effect else ""
        lines.append(f"       - call {e.tool_call_id!r} ({where}, {e.status}{same}, {e.at}): "
                     + json.dumps(e.arguments, ensure_ascii=False)[:200])
    return lines


def provenance_lines(p: PendingApproval) -> list[str]:
    """Where the sensitive arguments' values came from (information-flow
    rules): an untrusted source first seen is what a reviewer must weigh."""
    lines = []
    for name, sources in p.provenance.items():
        for s in sources:
            trust = "trusted" if s.trusted else "UNTRUSTED"
            shown = f" {s.value}" if s.value else ""
            lines.append(f"    {'>>' if s.trusted else '!!'} {name}:{shown} found in "
                         f"{s.where()} ({trust})")
    return lines


def audit_provenance(stored: str | None) -> dict[str, list[dict[str, Any]]] | None:
    """An audit row's `provenance` column read back (argument -> sources, as
    masked when written), or None when the row has none or it is not that."""
    if not stored:
        return None
    try:
        found = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    return {str(name): [s for s in sources if isinstance(s, dict)]
            for name, sources in found.items() if isinstance(sources, list)}


def source_words(s: Mapping[str, Any]) -> str:
    """One source, compactly: `user`, `tool read_inbox (call_3)`,
    `retrieval 'Title'`; with its masked value, and `UNTRUSTED` when it is."""
    kind = str(s.get("kind") or "?")
    where = kind
    if s.get("tool_name") or s.get("tool_call_id"):
        where += f" {s.get('tool_name') or '?'} ({s.get('tool_call_id') or 'no call id'})"
    elif s.get("title"):
        where += f" {str(s['title'])!r}"
    value = f" {json.dumps(s['value'], ensure_ascii=False)}" if s.get("value") else ""
    return f"{'' if s.get('trusted') else 'UNTRUSTED '}{where}{value}"


def audit_notes(row: Mapping[str, Any]) -> list[str]:
    """The lines under an audit row: where each sensitive argument's values
    came from, and why the rules refused a FLOW_REFUSED call."""
    lines = [f"    {name} <- " + ", ".join(source_words(s) for s in sources)
             for name, sources in (audit_provenance(row.get("provenance")) or {}).items()]
    if row.get("status") == AuditStatus.FLOW_REFUSED.value:
        text = str(row.get("error_message") or "")
        lines.append(f"    refused: {refusal_reason(text) or text}")
    return lines


def result_lines(result: TurnResult, web_ui: str) -> list[str]:
    lines = ["", f"status: {result.status.value}   round trips: {result.round_trips}   "
             f"provider: {result.provider}"]
    for c in result.tool_calls:
        flag = " (error)" if c.is_error else ""
        lines.append(f"  tool {c.name} [{c.status.value}]{flag} "
                     f"{json.dumps(c.arguments)[:160]}")
    if result.error:
        lines.append(f"error: {result.error.type}: {result.error.message}")
    return [*lines, "", f"answer:\n{result.answer}", "", f"Web UI: {web_ui}"]


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *,
          numeric: frozenset[str] = frozenset(), width: int = 60,
          total: bool = False) -> list[str]:
    """An aligned table: a header, a line a row (cells cut at `width`; numbers
    right-aligned with thousands separators) and, with `total`, a line
    summing the numeric columns."""
    def cell(col: str, value: Any) -> str:
        if col in numeric:
            return f"{value:,}"
        return str(value if value is not None else "")[:width]

    lines = [[cell(col, r[col]) for col in columns] for r in rows]
    if total:
        lines.append([cell(col, sum(r[col] for r in rows)) if col in numeric
                      else ("total" if i == 0 else "") for i, col in enumerate(columns)])
    widths = [max(len(col), *(len(line[i]) for line in lines)) for i, col in enumerate(columns)]

    def row(cells: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if col in numeric else v.ljust(w)
                         for col, v, w in zip(columns, cells, widths, strict=True)).rstrip()

    return [row(columns), *(row(line) for line in lines)]


def json_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return [json.dumps(dict(r), default=str) for r in rows]
