"""Why a call waited, on its audit row: additions only.

- `tool_execution_log.approval_reason`: for a call of a tool that asks for
  approval by condition (`@tool(approval=...)`) and waited, the condition's
  words (the `PendingApproval.reason` the reviewer saw); NULL for every other
  row, a tool that always asks included. `starter.py audit` prints it.

A previous release's worker does not name the column in its INSERT and
leaves it NULL (it asks by tool only). Rows written before this revision
stay NULL.

Named apart from other work on revision 0013: when two branches each add a
revision after 0012, the later one's `down_revision` is set to the other's.

Revision ID: 0013_audit_approval_reason
Revises: 0012_quarantined_message
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_audit_approval_reason"
down_revision = "0012_quarantined_message"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds a nullable column: older code's INSERTs leave it NULL.
compatible_with_previous = True


def upgrade() -> None:
    op.add_column("tool_execution_log", sa.Column("approval_reason", sa.Text))


def downgrade() -> None:
    op.drop_column("tool_execution_log", "approval_reason")
