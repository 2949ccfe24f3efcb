"""The outbox table an app declares: one row per message, the state machine's
columns (turnstile.outbox.store). Every outbox table has the same columns —
the sales app's `email_task` (docs/contract.md, "Tables") is one of them."""

from __future__ import annotations

import sqlalchemy as sa

from turnstile.stores.tables import Flag
from turnstile.stores.timestamps import Ts

# Tables the outbox declared, by (metadata, name): two apps naming the same
# table on the shared metadata get the same `sa.Table`.
_shared = sa.MetaData()


def outbox_table(name: str, *, metadata: sa.MetaData | None = None,
                 insert_role: str | None = None, sender_role: str | None = None) -> sa.Table:
    """The outbox table `name` on `metadata` (None: the outbox's own, shared
    by every app that names the same table). PostgreSQL roles: `insert_role`
    may only INSERT (the tool that queues), `sender_role` may SELECT and
    UPDATE (the sender, status, cancel, requeue); None: the application's own."""
    meta = _shared if metadata is None else metadata
    if name in meta.tables:
        return meta.tables[name]
    grants: dict[str, str] = {}
    if insert_role is not None:
        grants[insert_role] = "INSERT"
    if sender_role is not None:
        grants[sender_role] = "SELECT, UPDATE"
    # `outbox`: marks the table for `starter.py check` (turnstile.sales.truth
    # .outbox_disagreements), which finds the served apps' outboxes by it.
    info: dict[str, object] = {"outbox": True}
    if grants:
        info["grants"] = grants
    return sa.Table(
        name, meta,
        sa.Column("task_id", sa.Text, primary_key=True),
        sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
        sa.Column("recipient", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", Ts, nullable=False),
        sa.Column("updated_at", Ts, nullable=False),
        sa.Column("message_id", sa.Text, nullable=False),
        sa.Column("next_attempt_at", Ts),
        sa.Column("claimed_by", sa.Text),
        sa.Column("claimed_at", Ts),
        sa.Column("sent_at", Ts),
        sa.Column("possibly_sent", Flag, nullable=False, server_default=sa.false()),
        sa.Index(f"{name}_due_idx", "status", "next_attempt_at"),
        info=info,
    )
