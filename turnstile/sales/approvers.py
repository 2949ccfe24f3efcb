"""Who may approve the sales assistant's calls: the `approver` table.

`approver(service, tool, reviewer)`: each row allows `reviewer` to decide
calls of `tool` (or of every tool when `tool` is "*") in `service`. A service
with no rows keeps the default policy: any named reviewer except the user who
asked. The reference service ships with no rows; an operator narrows it:

    INSERT INTO approver (service, tool, reviewer)
        VALUES ('sales-assistant', 'createEmailTask', 'ops-lead');

The table is read when a turn starts (activity `turnstile.describe_service`),
so a change applies to turns started afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from turnstile.runtime.services import ApproverContext
from turnstile.stores.db import Database, Dialect, schema


@schema
def approver_schema(dialect: Dialect) -> list[str]:
    return ["""CREATE TABLE IF NOT EXISTS approver (
        service TEXT NOT NULL,
        tool TEXT NOT NULL,
        reviewer TEXT NOT NULL,
        PRIMARY KEY (service, tool, reviewer))"""]


def table_approvers(ctx: ApproverContext) -> Mapping[str, Iterable[str]]:
    """The resolver of the reference service: rows of `approver` by tool."""
    db: Database = ctx.db
    with db.connect() as conn:
        rows = conn.fetchall("SELECT tool, reviewer FROM approver WHERE service = ?",
                             (ctx.service,))
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["tool"], []).append(row["reviewer"])
    return out
