"""Standing approvals (grants): two new tables and one nullable column (additive).

- `approval_grant`: one row per grant a reviewer issued with an approval —
  the tool and service it covers, its scope (`conversation`, `user`,
  `service`) and the scope's key, its argument constraints (JSON), `until`
  (UTC), `max_uses` and `uses` (claimed so far), `covers_untrusted`, who
  issued it and why, the call whose approval issued it, and who revoked it
  when (`revoked_at`, `revoked_by`, `revoke_reason`; NULL while it stands).
- `grant_use`: one row per call a grant approved, unique per call
  (`workflow_id`, `execution_chain`, `tool_call_id`): a use is claimed once.
- `tool_execution_log.grant_id`: on the row of a call a grant approved, the
  grant's id; NULL for every other row.

A previous release's worker never reads or writes the tables and leaves the
column NULL (its INSERTs do not name it).

Revision ID: 0015_approval_grants
Revises: 0014_audit_provenance
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_approval_grants"
down_revision = "0014_audit_provenance"
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# New tables and a nullable column: older code's INSERTs leave it NULL.
compatible_with_previous = True


def upgrade() -> None:
    op.create_table(
        "approval_grant",
        sa.Column("grant_id", sa.Text, primary_key=True),
        *(sa.Column(name, sa.Text, nullable=False)
          for name in ("service", "tool_name", "scope", "scope_key", "constraints", "until")),
        sa.Column("max_uses", sa.Integer, nullable=False),
        sa.Column("uses", sa.Integer, nullable=False, server_default="0"),
        sa.Column("covers_untrusted", sa.Integer, nullable=False, server_default="0"),
        *(sa.Column(name, sa.Text, nullable=False) for name in ("issued_by", "issued_at")),
        *(sa.Column(name, sa.Text) for name in (
            "reason", "workflow_id", "execution_chain", "tool_call_id", "requested_by",
            "revoked_at", "revoked_by", "revoke_reason")),
    )
    op.create_index("approval_grant_tool", "approval_grant", ["service", "tool_name"])
    op.create_table(
        "grant_use",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        *(sa.Column(name, sa.Text, nullable=False)
          for name in ("grant_id", "workflow_id", "execution_chain", "tool_call_id",
                       "tool_name", "conversation_id", "user_id", "used_at")),
        sa.UniqueConstraint("workflow_id", "execution_chain", "tool_call_id",
                            name="grant_use_call"),
    )
    op.create_index("grant_use_grant", "grant_use", ["grant_id"])
    op.add_column("tool_execution_log", sa.Column("grant_id", sa.Text))


def downgrade() -> None:
    op.drop_column("tool_execution_log", "grant_id")
    op.drop_index("grant_use_grant", "grant_use")
    op.drop_table("grant_use")
    op.drop_index("approval_grant_tool", "approval_grant")
    op.drop_table("approval_grant")
