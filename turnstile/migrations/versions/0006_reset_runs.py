"""Runs of one turn ("Temporal reset"): additions only.

- `chat_message.run_id`: the Temporal run that wrote the row (NULL on rows
  written before this revision, and on rows other programs insert), with an
  index on (conversation_id, workflow_id) for the check every run-aware write
  makes: "are there rows of another run of my turn here?";
- `conversation_lock.execution_chain`: the lock is held by the turn's
  execution chain, so a reset run of the turn keeps it (NULL on locks taken
  before this revision: held by their run id, as before);
- `superseded_message`: messages a reset run replaced, moved out of
  `chat_message` (which holds one row per slot) and kept for the record,
  with the run that superseded them and when.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds nullable columns, an index and a table.
compatible_with_previous = True

# A yes/no column as the earlier revisions make it (a revision keeps its own types).
FLAG = sa.Integer().with_variant(sa.Boolean(), "postgresql")


def upgrade() -> None:
    op.add_column("chat_message", sa.Column("run_id", sa.Text))
    op.create_index("chat_message_writer", "chat_message", ["conversation_id", "workflow_id"])
    op.add_column("conversation_lock", sa.Column("execution_chain", sa.Text))
    op.create_table(
        "superseded_message",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("conversation_id", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("content", sa.Text),
        sa.Column("tool_calls", sa.Text),
        sa.Column("tool_call_id", sa.Text),
        sa.Column("is_error", FLAG, nullable=False, server_default=sa.false()),
        sa.Column("attributes", sa.Text),
        sa.Column("parts", sa.Text),
        sa.Column("created_at", sa.Text),
        sa.Column("workflow_id", sa.Text),
        sa.Column("execution_chain", sa.Text),
        sa.Column("run_id", sa.Text),
        sa.Column("superseded_by", sa.Text, nullable=False),
        sa.Column("superseded_at", sa.Text, nullable=False),
        sa.Column("settled_at", sa.Text),
    )
    op.create_index("superseded_message_conversation", "superseded_message",
                    ["conversation_id", "seq"])


def downgrade() -> None:
    op.drop_index("superseded_message_conversation", "superseded_message")
    op.drop_table("superseded_message")
    op.drop_column("conversation_lock", "execution_chain")
    op.drop_index("chat_message_writer", "chat_message")
    op.drop_column("chat_message", "run_id")
