"""A budget is a person's however the name is cased and scripted: additions only.

- `model_usage.person_upper`, `model_usage.person_written`: with `person`,
  the three skeletons of the user id (turnstile.engine.identity.person_keys:
  in lower case, in capitals, as written). A budget counts every row one of
  whose keys is one of the user's, so `ТОМ` (Cyrillic capitals) spends
  `tom`'s budget. Filled here for every row already written, `person` too
  (from its `user_id`, by today's rule). A previous release's worker leaves
  the two new columns NULL; the budget then reads the row by its `user_id`
  through the rule (turnstile.stores.usage.tokens_since), so no row stops
  counting.
- indexes `model_usage_person_upper_time`, `model_usage_person_written_time`
  (key, recorded_at): a person's tokens in a window, through any key.

Named apart from other work on revision 0011: when two branches each add a
revision after 0010_decision_edits, the later one's `down_revision` is set
to the other's.

Revision ID: 0011_usage_person_keys
Revises: 0010_decision_edits
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from turnstile.engine.identity import person_keys

revision = "0011_usage_person_keys"
down_revision = "0010_decision_edits"
branch_labels = None
depends_on = None

# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Yes: two nullable columns and two indexes; its rows keep counting by user id.
compatible_with_previous = True


def upgrade() -> None:
    op.add_column("model_usage", sa.Column("person_upper", sa.Text))
    op.add_column("model_usage", sa.Column("person_written", sa.Text))
    conn = op.get_bind()
    table = sa.table("model_usage", sa.column("user_id", sa.Text), sa.column("person", sa.Text),
                     sa.column("person_upper", sa.Text), sa.column("person_written", sa.Text))
    users = [r[0] for r in conn.execute(sa.select(table.c.user_id).distinct())]
    for user in users:
        keys = person_keys(user)
        conn.execute(table.update().where(table.c.user_id == user).values(
            person=keys.lower, person_upper=keys.upper, person_written=keys.written))
    op.create_index("model_usage_person_upper_time", "model_usage",
                    ["person_upper", "recorded_at"])
    op.create_index("model_usage_person_written_time", "model_usage",
                    ["person_written", "recorded_at"])


def downgrade() -> None:
    op.drop_index("model_usage_person_written_time", "model_usage")
    op.drop_index("model_usage_person_upper_time", "model_usage")
    op.drop_column("model_usage", "person_written")
    op.drop_column("model_usage", "person_upper")
