"""Damaged rows set aside: a new table only (additive).

- `quarantined_message`: a `chat_message` row an operator set aside with
  `python starter.py conversation quarantine CONVERSATION_ID SEQ` (a row the
  product cannot read: turnstile.stores.damage), copied as it was with who
  set it aside, when and why (its images, `chat_message_part` rows, as a
  JSON list in `parts`). The row leaves `chat_message`, so no window
  reads it again; nothing is deleted from the record.

Compatible with the previous release: a new table, no column changed. A
previous release's worker never reads or writes it (`compatible_with_previous`).

Revision ID: 0012_quarantined_message
Revises: 0011_usage_person_keys
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_quarantined_message"
down_revision = "0011_usage_person_keys"
branch_labels = None
depends_on = None

# The previous release's worker runs on a schema with this revision applied.
compatible_with_previous = True


def upgrade() -> None:
    flag = sa.Integer().with_variant(sa.Boolean(), "postgresql")
    op.create_table(
        "quarantined_message",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("conversation_id", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        *(sa.Column(name, sa.Text) for name in ("role", "content", "tool_calls",
                                                "tool_call_id")),
        sa.Column("is_error", flag),
        *(sa.Column(name, sa.Text) for name in ("attributes", "created_at", "workflow_id",
                                                "execution_chain", "run_id", "parts")),
        *(sa.Column(name, sa.Text, nullable=False)
          for name in ("quarantined_by", "quarantined_at", "reason")),
    )
    op.create_index("quarantined_message_conversation", "quarantined_message",
                    ["conversation_id", "seq"])


def downgrade() -> None:
    op.drop_index("quarantined_message_conversation", "quarantined_message")
    op.drop_table("quarantined_message")
