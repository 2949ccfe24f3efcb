"""Keys scoped to the turn's execution chain.

A provider's tool-call ids repeat (`call_0`, `call_1` across turns, and a
new start of a closed workflow id reuses them), so a call is identified by
workflow id + execution chain (Temporal's `first_execution_run_id`: the
same across reset, workflow retry and continue-as-new, new for a new start)
+ call id:

- `tool_call_ledger` and `approval_decision` get `execution_chain` in their
  primary keys (rows written before this revision keep the chain '');
- `chat_message` and `tool_execution_log` record the chain of the turn that
  wrote them, so a rollback rewrites only that turn's results.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Changes two primary keys: older code's `ON CONFLICT (workflow_id,
# tool_call_id)` on tool_call_ledger and approval_decision names a key that
# no longer exists (0.1's store wrote them so).
compatible_with_previous = False

_KEYED = ("tool_call_ledger", "approval_decision")


def _columns(table: str) -> list[sa.Column[object]]:
    """The columns of `table` other than its keys, as revision 0001 made them."""
    if table == "tool_call_ledger":
        return [
            sa.Column("tool_name", sa.Text, nullable=False),
            sa.Column("status", sa.Text, nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False, server_default="1"),
            sa.Column("result", sa.Text),
            sa.Column("is_error", sa.Integer, nullable=False, server_default="0"),
            sa.Column("outcome", sa.Text),
            sa.Column("state", sa.Text),
            sa.Column("started_at", sa.Text, nullable=False),
            sa.Column("finished_at", sa.Text),
        ]
    return [
        sa.Column("tool_name", sa.Text, nullable=False),
        sa.Column("approved", sa.Integer, nullable=False),
        sa.Column("reviewer", sa.Text, nullable=False),
        sa.Column("note", sa.Text),
        sa.Column("decided_at", sa.Text, nullable=False),
    ]


def _rekey_sqlite(table: str, *, chained: bool) -> None:
    """SQLite cannot alter a primary key: the table is copied into one with
    the new key (rows before this revision get the chain '')."""
    keys = ["workflow_id", "execution_chain", "tool_call_id"] if chained else [
        "workflow_id", "tool_call_id"]
    new = f"_rekey_{table}"
    cols: list[sa.Column[object]] = [sa.Column("workflow_id", sa.Text, nullable=False),
                                     sa.Column("tool_call_id", sa.Text, nullable=False)]
    if chained:
        cols.append(sa.Column("execution_chain", sa.Text, nullable=False, server_default=""))
    rest = _columns(table)
    op.create_table(new, *cols, *rest, sa.PrimaryKeyConstraint(*keys))
    copied = ", ".join(["workflow_id", "tool_call_id", *(c.name for c in rest)])
    op.execute(f"INSERT INTO {new} ({copied}) SELECT {copied} FROM {table}")
    op.drop_table(table)
    op.rename_table(new, table)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for table in _KEYED:
        if postgres:
            op.add_column(table, sa.Column("execution_chain", sa.Text, nullable=False,
                                           server_default=""))
            op.drop_constraint(f"{table}_pkey", table, type_="primary")
            op.create_primary_key(f"{table}_pkey", table,
                                  ["workflow_id", "execution_chain", "tool_call_id"])
        else:
            _rekey_sqlite(table, chained=True)
    op.add_column("chat_message", sa.Column("execution_chain", sa.Text))
    op.add_column("tool_execution_log", sa.Column("execution_chain", sa.Text))


def downgrade() -> None:
    op.drop_column("tool_execution_log", "execution_chain")
    op.drop_column("chat_message", "execution_chain")
    postgres = op.get_bind().dialect.name == "postgresql"
    for table in _KEYED:
        if postgres:
            op.drop_constraint(f"{table}_pkey", table, type_="primary")
            op.create_primary_key(f"{table}_pkey", table, ["workflow_id", "tool_call_id"])
            op.drop_column(table, "execution_chain")
        else:
            _rekey_sqlite(table, chained=False)
