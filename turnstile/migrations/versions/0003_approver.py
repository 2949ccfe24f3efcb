"""`approver(service, tool, reviewer)`: who may decide the approvals of a
service's tool calls (the reference service's approver policy;
docs/approvals-guide.md). Empty: the default policy, any named reviewer except the user
who asked.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds a table.
compatible_with_previous = True


def serves_sales() -> bool:
    """Are the sales app's tables made? The reference app's tables were
    made by these revisions before apps were chosen (TURNSTILE_APPS); a
    database migrated for other apps only leaves them out
    (turnstile.stores.schema passes the served apps; None: every app)."""
    apps = context.config.attributes.get("apps")
    return apps is None or "sales" in apps


def upgrade() -> None:
    if not serves_sales():
        return
    op.create_table(
        "approver",
        sa.Column("service", sa.Text, nullable=False),
        sa.Column("tool", sa.Text, nullable=False),
        sa.Column("reviewer", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("service", "tool", "reviewer"),
    )


def downgrade() -> None:
    op.drop_table("approver")
