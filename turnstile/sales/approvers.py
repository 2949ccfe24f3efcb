"""Who may approve the sales assistant's calls: the `approver` table.

`approver(service, tool, reviewer)`: each row allows `reviewer` to decide
calls of `tool` (or of every tool when `tool` is "*") in `service`. A service
with no rows keeps the default policy: any named reviewer except the user who
asked. The reference service ships with no rows; an operator narrows it:

    INSERT INTO approver (service, tool, reviewer)
        VALUES ('sales-assistant', 'createEmailTask', 'ops-lead');

The table is read when a turn starts (local activity `turnstile.begin_turn`),
so a change applies to turns started afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import sqlalchemy as sa

from turnstile import ApproverContext, Database
from turnstile.sales.schema import approver


def table_approvers(ctx: ApproverContext) -> Mapping[str, Iterable[str]]:
    """The resolver of the reference service: rows of `approver` by tool."""
    db: Database = ctx.db
    with db.connect() as conn:
        rows = conn.sa.execute(sa.select(approver.c.tool, approver.c.reviewer)
                               .where(approver.c.service == ctx.service)).all()
    out: dict[str, list[str]] = {}
    for tool, reviewer in rows:
        out.setdefault(str(tool), []).append(str(reviewer))
    return out
