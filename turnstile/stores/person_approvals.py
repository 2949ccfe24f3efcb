"""Which calls a person approved, one by one (`approval_decision`), for the
information-flow rules: the values of such a call's arguments are trusted
in the rest of its conversation (turnstile.activities.flow_sources;
docs/information-flow.md, "Values a person approved").

A decision counts when it approved the call and a reviewer made it: not a
standing approval (a grant's decision names its reviewer `grant:<id>`,
turnstile.workflows.standing_approvals), not the deadline (which only
rejects), not a call that never waited (an approval condition that said
no, a tool without approval: those have no decision at all).
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from turnstile.engine.grant_models import GRANT_REVIEWER_PREFIX
from turnstile.stores.audit import approval_decision
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database

MAX_CALLS = 2_000  # the calls asked about at once (a conversation's window holds fewer)
_CHUNK = 400  # ids per statement (SQLite's bound parameters)

d = approval_decision.c


def approved_by_person(db: Database, calls: Iterable[tuple[str, str]],
                       conn: Connection | None = None) -> set[tuple[str, str]]:
    """The (workflow id, tool call id) pairs among `calls` that a person approved."""
    wanted = list(dict.fromkeys(calls))[:MAX_CALLS]
    if not wanted:
        return set()
    found: set[tuple[str, str]] = set()
    with db.joined(conn) as c:
        for at in range(0, len(wanted), _CHUNK):
            chunk = wanted[at:at + _CHUNK]
            rows = c.execute(sa.select(d.workflow_id, d.tool_call_id, d.reviewer).where(
                d.approved == 1, d.tool_call_id.in_({call for _, call in chunk}),
                d.workflow_id.in_({wf for wf, _ in chunk}))).all()
            found.update((r.workflow_id, r.tool_call_id) for r in rows
                         if not str(r.reviewer or "").startswith(GRANT_REVIEWER_PREFIX))
    return found & set(wanted)
