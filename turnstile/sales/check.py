"""`python starter.py check`: the truth check (turnstile.sales.truth) over
every conversation but those a running turn holds.

A conversation keeps its lock row while a turn holds it, and also after a
turn ended without running its own code (terminated, timed out, lost, reset
away): the state most worth checking. So each lock holder is asked of
Temporal (turnstile.runtime.holders). Conversations whose holder Temporal
reports running are skipped and listed as skipped; the others are checked,
and what their ended holder left for the next turn to repair (calls without
a result, audit rows left INITIATED) is named. A holder Temporal cannot
answer about (unreachable) leaves its conversation unchecked, listed, and
the check not clean. Every outbox table of the served apps (`tables`) is
checked by its rows' call keys (turnstile.sales.truth.outbox_disagreements).
A running holder whose workflow task has failed more than once is stuck,
not running: listed as `stuck: <workflow id> ...` with its last failure,
and the check exits 1. A damaged row of memory (one no turn can read:
turnstile.stores.damage) is listed as `damaged: CONVERSATION_ID seq N <what>`
and its conversation is not compared further; the check runs to its
end and exits 1."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from temporalio.client import Client
from temporalio.service import RPCError

from turnstile.runtime.holders import RUNNING, holder_state, stuck_failure
from turnstile.sales.truth import disagreements, outbox_disagreements
from turnstile.stores import truth
from turnstile.stores.db import Database
from turnstile.stores.lock import Holder
from turnstile.stores.quarantine import damaged_rows

log = logging.getLogger(__name__)

# Exit codes: clean, something disagrees or awaits repair, something could not be checked.
CLEAN, DISAGREES, UNCHECKED = 0, 1, 2


@dataclass
class CheckReport:
    disagreements: list[str] = field(default_factory=list)
    awaiting_repair: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # a running turn holds them
    stuck: list[str] = field(default_factory=list)  # a turn whose workflow task keeps failing
    unchecked: list[str] = field(default_factory=list)  # Temporal could not say
    damaged: list[str] = field(default_factory=list)  # rows no turn can read

    def lines(self) -> list[str]:
        """What the command prints, the count last."""
        return [*self.damaged, *self.disagreements, *(f"stuck: {line}" for line in self.stuck),
                *(f"awaits repair: {line}" for line in self.awaiting_repair),
                *(f"note: {line}" for line in self.notes),
                *(f"skipped: {line}" for line in self.skipped),
                *(f"unchecked: {line}" for line in self.unchecked),
                f"{len(self.disagreements)} disagreement(s)"
                + (f", {len(self.damaged)} damaged row(s)" if self.damaged else "")]

    @property
    def exit_code(self) -> int:
        if self.disagreements or self.awaiting_repair or self.stuck or self.damaged:
            return DISAGREES
        return UNCHECKED if self.unchecked else CLEAN


async def check(db: Database, temporal: Callable[[], Awaitable[Client]],
                conversation_id: str | None = None,
                tables: Sequence[sa.Table] = ()) -> CheckReport:
    """Check `conversation_id` (or every conversation). `temporal` gives a
    client; it is called only when some conversation is locked. `tables`:
    the served apps' tables, whose outboxes (turnstile.outbox) are checked."""
    holders = await asyncio.to_thread(truth.lock_holders, db, conversation_id)
    states, unknown, stuck = await _states(temporal, holders)
    report = CheckReport()
    busy = set(unknown)
    damage = await asyncio.to_thread(damaged_rows, db, conversation_id)
    report.damaged = [d.line() for d in damage]
    busy |= {d.conversation_id for d in damage}  # named; not compared further
    for conv, holder in sorted(holders.items()):
        if conv in stuck:
            busy.add(conv)  # its memory is the stuck turn's until it ends
            report.stuck.append(f"{holder.workflow_id} (conversation {conv}): {stuck[conv]}")
        elif states.get(conv) == RUNNING:
            busy.add(conv)
            report.skipped.append(f"conversation {conv}: held by running turn "
                                  f"{holder.workflow_id}")
        elif conv in unknown:
            report.unchecked.append(f"conversation {conv}: held by turn {holder.workflow_id}; "
                                    f"Temporal could not say whether it runs ({unknown[conv]})")
    report.disagreements = await asyncio.to_thread(disagreements, db, conversation_id, busy)
    report.disagreements += await asyncio.to_thread(outbox_disagreements, db, tables,
                                                    conversation_id, busy)
    report.notes = await asyncio.to_thread(truth.notes, db, conversation_id, busy)
    for conv, holder in sorted(holders.items()):
        if conv in busy:
            continue
        left = await asyncio.to_thread(truth.awaiting_repair, db, conv)
        ended = (f"conversation {conv}: its lock holder, turn {holder.workflow_id}, is no longer "
                 f"running ({states[conv]})")
        if left:
            report.awaiting_repair.append(
                f"{ended}; calls without a result: "
                f"{', '.join(left.calls) or 'none'}; audit rows left INITIATED: "
                f"{', '.join(left.audit_rows) or 'none'}")
        else:
            report.notes.append(f"{ended}; nothing awaits repair (its next turn takes the "
                                "lock over)")
    return report


async def _states(temporal: Callable[[], Awaitable[Client]], holders: dict[str, Holder]
                  ) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(state of each holder Temporal answered about, error of each it did not,
    why each running holder that is stuck is)."""
    states: dict[str, str] = {}
    unknown: dict[str, str] = {}
    stuck: dict[str, str] = {}
    if not holders:
        return states, unknown, stuck
    try:
        client = await temporal()
    except (RuntimeError, OSError, RPCError) as exc:
        log.warning("truth check: cannot reach Temporal: %s", exc)
        return states, dict.fromkeys(holders, f"cannot reach Temporal: {exc}"), stuck
    for conv, holder in holders.items():
        try:
            states[conv] = await holder_state(client, holder)
            if states[conv] == RUNNING:
                why = await stuck_failure(client, holder)
                if why is not None:
                    stuck[conv] = why
        except RPCError as exc:
            unknown[conv] = f"{exc.status.name}: {exc.message}"
    return states, unknown, stuck
