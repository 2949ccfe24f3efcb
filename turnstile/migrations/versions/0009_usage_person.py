"""Budgets by person, not by spelling: additions only.

- `model_usage.person`: who the call was for as the identity rule sees it
  (turnstile.engine.identity.person_key: RFC 8265 + UTS #39 skeleton), so
  `Alice`, `alice` and `аlice` (Cyrillic а) spend one daily budget. Filled
  here for every row already written (from its `user_id`); a previous
  release's worker leaves it NULL, and the budget then reads the row by its
  `user_id` (turnstile.stores.usage.tokens_since), so no row stops counting.
- index `model_usage_person_time` (person, recorded_at): a person's tokens in
  a window.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from turnstile.engine.identity import person_key

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds a nullable column (filled for rows already there) and an index.
compatible_with_previous = True


def upgrade() -> None:
    op.add_column("model_usage", sa.Column("person", sa.Text))
    conn = op.get_bind()
    table = sa.table("model_usage", sa.column("user_id", sa.Text),
                     sa.column("person", sa.Text))
    users = [r[0] for r in conn.execute(sa.select(table.c.user_id).distinct())]
    for user in users:
        conn.execute(table.update().where(table.c.user_id == user)
                     .values(person=person_key(user)))
    op.create_index("model_usage_person_time", "model_usage", ["person", "recorded_at"])


def downgrade() -> None:
    op.drop_index("model_usage_person_time", "model_usage")
    op.drop_column("model_usage", "person")
