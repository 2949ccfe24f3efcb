"""The schema of v0.1.0, exactly (git tag v0.1.0: the DDL its
`Database.ensure_schema` ran, from turnstile/{message_parts,store,audit,
conversation_lock,payload_store,retrieval,streaming}.py and
turnstile/sales/schema.py). Frozen: later changes are later revisions.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
# Can code of the revision before run on this one? (turnstile.stores.schema_window)
# The first revision: exactly the schema v0.1.0's code made for itself.
compatible_with_previous = True

READER_ROLE = "turnstile_reader"
# Every table this revision makes (retrieval_fts on SQLite only): a database
# holding them and no alembic_version is v0.1's (turnstile.stores.schema).
V0_1_TABLES = frozenset({
    "chat_message_part", "conversation", "chat_message", "tool_call_ledger",
    "tool_execution_log", "approval_decision", "conversation_lock", "payload_blob",
    "payload_ref", "retrieval_document", "sales_record", "follow_up_task", "email_task",
    "turn_stream",
})

# v0.1's column types: TEXT COLLATE "C" timestamps and BOOLEAN flags on
# PostgreSQL; TEXT and INTEGER on SQLite.
TS = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
FLAG = sa.Integer().with_variant(sa.Boolean(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def serves_sales() -> bool:
    """Are the sales app's tables made? The reference app's tables were
    made by these revisions before apps were chosen (TURNSTILE_APPS); a
    database migrated for other apps only leaves them out
    (turnstile.stores.schema passes the served apps; None: every app)."""
    apps = context.config.attributes.get("apps")
    return apps is None or "sales" in apps


# v0.1 wrote `TEXT PRIMARY KEY` / `INTEGER PRIMARY KEY` without NOT NULL: SQLite then allows NULL in
# it (PostgreSQL never does); `nullable=True` on those columns keeps that.


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "chat_message_part",
        sa.Column("conversation_id", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("idx", sa.Integer, nullable=False, autoincrement=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("url", sa.Text),
        sa.Column("data", sa.Text),
        sa.Column("mime_type", sa.Text),
        sa.PrimaryKeyConstraint("conversation_id", "seq", "idx"),
    )
    op.create_table(
        "conversation",
        sa.Column("conversation_id", sa.Text, primary_key=True, nullable=True),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
    )
    op.create_table(
        "chat_message",
        sa.Column("conversation_id", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("content", sa.Text),
        sa.Column("tool_calls", sa.Text),
        sa.Column("tool_call_id", sa.Text),
        sa.Column("is_error", FLAG, nullable=False, server_default=sa.false()),
        sa.Column("attributes", sa.Text),
        sa.Column("created_at", sa.Text),
        sa.Column("workflow_id", sa.Text),
        sa.PrimaryKeyConstraint("conversation_id", "seq"),
    )
    op.create_index("chat_message_call", "chat_message", ["conversation_id", "tool_call_id"])
    op.create_table(
        "tool_call_ledger",
        sa.Column("workflow_id", sa.Text, nullable=False),
        sa.Column("tool_call_id", sa.Text, nullable=False),
        sa.Column("tool_name", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="1"),
        sa.Column("result", sa.Text),
        sa.Column("is_error", sa.Integer, nullable=False, server_default="0"),
        sa.Column("outcome", sa.Text),
        sa.Column("state", sa.Text),
        sa.Column("started_at", sa.Text, nullable=False),
        sa.Column("finished_at", sa.Text),
        sa.PrimaryKeyConstraint("workflow_id", "tool_call_id"),
    )
    op.create_table(
        "tool_execution_log",
        sa.Column("execution_id", sa.Text, primary_key=True, nullable=True),
        sa.Column("workflow_id", sa.Text, nullable=False),
        sa.Column("conversation_id", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("tool_name", sa.Text, nullable=False),
        sa.Column("input_params", sa.Text),
        sa.Column("start_time", sa.Text, nullable=False),
        sa.Column("end_time", sa.Text),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("error_message", sa.Text),
    )
    op.create_index("tool_execution_log_workflow", "tool_execution_log", ["workflow_id"])
    op.create_table(
        "approval_decision",
        sa.Column("workflow_id", sa.Text, nullable=False),
        sa.Column("tool_call_id", sa.Text, nullable=False),
        sa.Column("tool_name", sa.Text, nullable=False),
        sa.Column("approved", sa.Integer, nullable=False),
        sa.Column("reviewer", sa.Text, nullable=False),
        sa.Column("note", sa.Text),
        sa.Column("decided_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("workflow_id", "tool_call_id"),
    )
    op.create_table(
        "conversation_lock",
        sa.Column("conversation_id", sa.Text, primary_key=True, nullable=True),
        sa.Column("workflow_id", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("acquired_at", sa.Text, nullable=False),
    )
    op.create_table(
        "payload_blob",
        sa.Column("key", sa.Text, primary_key=True, nullable=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
    )
    op.create_table(
        "payload_ref",
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("workflow_id", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("key", "workflow_id"),
    )
    document_columns = [
        sa.Column("service", sa.Text, nullable=False),
        sa.Column("doc_id", sa.Text, nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("content_hash", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
    ]
    if pg:
        from sqlalchemy.dialects.postgresql import TSVECTOR

        document_columns.append(sa.Column(
            "tsv", TSVECTOR,
            sa.Computed("to_tsvector('english', title || ' ' || body)", persisted=True)))
    op.create_table("retrieval_document", *document_columns,
                    sa.PrimaryKeyConstraint("service", "doc_id"))
    if pg:
        op.create_index("retrieval_document_tsv", "retrieval_document", ["tsv"],
                        postgresql_using="gin")
    else:
        op.execute("""CREATE VIRTUAL TABLE retrieval_fts USING fts5(
            service UNINDEXED, doc_id UNINDEXED, title, body,
            tokenize = 'porter unicode61')""")
    sales = serves_sales()
    if sales:
        _sales_tables(pg)
    if pg:
        # v0.1 made the read-only role here when it could; a DDL user without
        # CREATEROLE leaves it to the operator (deploy/postgres does it).
        grant = f"GRANT SELECT ON sales_record TO {READER_ROLE};" if sales else ""
        op.execute(f"""DO $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN
                BEGIN
                    CREATE ROLE {READER_ROLE} LOGIN;
                EXCEPTION
                    WHEN duplicate_object OR unique_violation THEN NULL;
                    WHEN insufficient_privilege THEN
                        RAISE NOTICE 'cannot create role {READER_ROLE}: set DATABASE_READONLY_URL';
                END;
            END IF;
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN
                BEGIN
                    EXECUTE 'GRANT USAGE ON SCHEMA ' || quote_ident(current_schema())
                        || ' TO {READER_ROLE}';
                    {grant}
                EXCEPTION
                    WHEN insufficient_privilege THEN
                        RAISE NOTICE 'cannot grant SELECT on sales_record to {READER_ROLE}';
                END;
            END IF;
        END
        $$""")
    if sales:
        op.create_index("sales_record_time_amount_idx", "sales_record",
                        ["create_time", "amount_cents"])
        op.create_index("email_task_due_idx", "email_task", ["status", "next_attempt_at"])
    op.create_table(
        "turn_stream",
        sa.Column("workflow_id", sa.Text, nullable=False),
        sa.Column("response_seq", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("attempt", sa.Integer, nullable=False, autoincrement=False),
        sa.Column("chunk", sa.Integer, nullable=False, autoincrement=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("done", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("workflow_id", "response_seq", "attempt", "chunk"),
    )
    op.create_index("turn_stream_created", "turn_stream", ["created_at"])


def _sales_tables(pg: bool) -> None:
    """The sales app's tables of v0.1 (sales_record, follow_up_task, email_task)."""
    op.create_table(
        "sales_record",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=False, nullable=True),
        sa.Column("customer_id", sa.Text, nullable=False),
        sa.Column("customer_name", sa.Text, nullable=False),
        sa.Column("customer_email", sa.Text, nullable=False),
        sa.Column("amount_cents", BIG_ID, sa.CheckConstraint("amount_cents >= 0"),
                  nullable=False),
        sa.Column("create_time", TS, nullable=False),
    )
    op.create_table(
        "follow_up_task",
        sa.Column("id", BIG_ID, sa.Identity(), primary_key=True, nullable=not pg),
        sa.Column("customer_id", sa.Text, nullable=False),
        sa.Column("assignee", sa.Text, nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="OPEN"),
        sa.Column("created_by_call", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("created_by_call", "customer_id"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "email_task",
        sa.Column("task_id", sa.Text, primary_key=True, nullable=True),
        sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
        sa.Column("recipient", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("message_id", sa.Text, nullable=False),
        sa.Column("next_attempt_at", TS),
        sa.Column("claimed_by", sa.Text),
        sa.Column("claimed_at", TS),
        sa.Column("sent_at", TS),
        sa.Column("possibly_sent", FLAG, nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    raise NotImplementedError("0001 is the first revision: drop the database instead")
