"""Per-turn reads bounded by the window, not the conversation: additions only.

- `conversation.answered_through`: every tool call at a slot up to it has its
  result, so the orphan repair of each new turn reads only the rows after it
  (NULL, as on every conversation written before this revision: read from the
  start once, then set). A previous release's worker leaves it alone.
- index `chat_message_role` (conversation_id, role, seq): the newest system
  message without a scan;
- partial index `chat_message_state`: the tool results that carry
  cross-round state (`MemoryStore.state`).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds a nullable column and indexes.
compatible_with_previous = True

STATEFUL = "role = 'tool' AND attributes LIKE '%\"turnstile.state\"%'"


def upgrade() -> None:
    op.add_column("conversation", sa.Column("answered_through", sa.BigInteger))
    op.create_index("chat_message_role", "chat_message", ["conversation_id", "role", "seq"])
    op.create_index("chat_message_state", "chat_message", ["conversation_id", "seq"],
                    sqlite_where=sa.text(STATEFUL), postgresql_where=sa.text(STATEFUL))


def downgrade() -> None:
    op.drop_index("chat_message_state", "chat_message")
    op.drop_index("chat_message_role", "chat_message")
    op.drop_column("conversation", "answered_through")
