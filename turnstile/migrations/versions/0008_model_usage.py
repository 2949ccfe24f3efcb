"""What each model call cost: additions only.

- table `model_usage`: one row per model call (turnstile.stores.usage), keyed
  by `usage_key` (`<workflow id>/<run id>/<memory slot of the answer>`), so a
  retried activity attempt does not count a call twice;
- index `model_usage_user_time` (user_id, recorded_at): a user's tokens in a
  window (the daily token budget, `starter.py usage --user`).

A previous release's worker does not know the table and leaves it alone.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds a table.
compatible_with_previous = True


def upgrade() -> None:
    op.create_table(
        "model_usage",
        sa.Column("usage_key", sa.Text, primary_key=True),
        sa.Column("workflow_id", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("call_seq", sa.BigInteger, nullable=False),
        sa.Column("conversation_id", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("service", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("recorded_at", sa.Text, nullable=False),
    )
    op.create_index("model_usage_user_time", "model_usage", ["user_id", "recorded_at"])


def downgrade() -> None:
    op.drop_index("model_usage_user_time", "model_usage")
    op.drop_table("model_usage")
