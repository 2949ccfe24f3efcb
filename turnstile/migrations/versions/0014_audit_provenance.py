"""Where a call's sensitive arguments came from, on its audit row: additions only.

- `tool_execution_log.provenance`: for a call of a tool with sensitive
  arguments (`@tool(sensitive=...)` or an effectful tool's defaults) in a
  turn begun at revision 7 or later, JSON text mapping each argument to the
  sources its values were found in (the user's message, or a tool's name
  and call id, ...: docs/information-flow.md), masked; NULL for every other
  row. Calls the rules refused have status `FLOW_REFUSED`.

A previous release's worker does not name the column in its INSERT and
leaves it NULL (it derives no provenance). Rows written before this
revision stay NULL.

Revision ID: 0014_audit_provenance
Revises: 0013_audit_approval_reason
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_audit_provenance"
down_revision = "0013_audit_approval_reason"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# Adds a nullable column: older code's INSERTs leave it NULL.
compatible_with_previous = True


def upgrade() -> None:
    op.add_column("tool_execution_log", sa.Column("provenance", sa.Text))


def downgrade() -> None:
    op.drop_column("tool_execution_log", "provenance")
