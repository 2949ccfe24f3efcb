"""The reviewer's edits kept with the decision: additions only.

- `approval_decision.edited_arguments`: for an approval with edits, the
  reviewer's complete arguments the tool ran with, masked and bounded as the
  audit log keeps arguments (turnstile.stores.audit.masked_params); NULL for
  every other decision. Until now the edits lived only in the call's
  `APPROVED_WITH_EDITS` audit row, which TURNSTILE_AUDIT=off does not write.

A previous release's worker does not name the column in its INSERT and
leaves it NULL (its approvals carry no edits). Rows written before this
revision stay NULL; readers fall back to the audit row
(turnstile.inbox.records).

Named apart from other work on revision 0010: when two branches each add a
revision after 0009, the later one's `down_revision` is set to the other's.

Revision ID: 0010_decision_edits
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_decision_edits"
down_revision = "0009"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds a nullable column: older code's INSERTs leave it NULL.
compatible_with_previous = True


def upgrade() -> None:
    op.add_column("approval_decision", sa.Column("edited_arguments", sa.Text))


def downgrade() -> None:
    op.drop_column("approval_decision", "edited_arguments")
