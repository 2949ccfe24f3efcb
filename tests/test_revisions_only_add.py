"""Expand, then contract: each Alembic revision since v0.1 that a release
added only adds (tables, nullable or defaulted columns, indexes), so the
previous release's worker keeps working on the migrated schema while it
drains — on SQLite and PostgreSQL. (v0.1's schema and its upgrade:
tests/test_migrations.py; the previous release's worker run against it:
tests/test_previous_release.py.)"""

from __future__ import annotations

import sqlalchemy as sa

from tests.support.releases import head_at, previous_release
from tests.support.schemas import schema_of
from tests.support.sql import fetchall
from turnstile.stores.db import Database
from turnstile.stores.engines import engine_for
from turnstile.stores.schema import upgrade


def test_revision_0006_only_adds(fresh_url: str) -> None:
    """Reset runs (0006) add columns, an index and a table: every column,
    key and index that 0005 made is still there, unchanged."""
    db = Database(fresh_url)
    upgrade(db, "0005")
    before = schema_of(db)
    upgrade(db, "0006")
    after = schema_of(db)
    for table, shape in before.items():
        assert after[table]["pk"] == shape["pk"], table
        assert set(shape["columns"]) <= set(after[table]["columns"]), table
        assert set(shape["indexes"]) <= set(after[table]["indexes"]), table
    added = {t: sorted({c[0] for c in after[t]["columns"]} - {c[0] for c in before[t]["columns"]})
             for t in before}
    assert {t: c for t, c in added.items() if c} == {
        "chat_message": ["run_id"], "conversation_lock": ["execution_chain"]}
    assert set(after) - set(before) == {"superseded_message"}


def test_revision_0008_only_adds(fresh_url: str) -> None:
    """Model usage (0008) adds a table and its index, nothing else."""
    db = Database(fresh_url)
    upgrade(db, "0007")
    before = schema_of(db)
    upgrade(db, "0008")
    after = schema_of(db)
    assert {t: after[t] for t in before} == before
    assert set(after) - set(before) == {"model_usage"}
    assert after["model_usage"]["pk"] == ["usage_key"]
    assert after["model_usage"]["indexes"] == [
        ("model_usage_user_time", ("user_id", "recorded_at"), False)]


def test_revision_0010_decision_edits_only_adds(fresh_url: str) -> None:
    """The reviewer's edits on the decision (0010_decision_edits) add one
    nullable column, nothing else; a decision written as the previous
    release's worker writes it (without the column) reads it as NULL, and
    downgrading drops it again."""
    db = Database(fresh_url)
    upgrade(db, "0009")
    before = schema_of(db)
    upgrade(db, "0010_decision_edits")
    after = schema_of(db)
    assert {t: after[t] for t in before if t != "approval_decision"} == {
        t: shape for t, shape in before.items() if t != "approval_decision"}
    old, new = before["approval_decision"], after["approval_decision"]
    assert {k: v for k, v in new.items() if k != "columns"} == {
        k: v for k, v in old.items() if k != "columns"}
    assert new["columns"] == [*old["columns"], ("edited_arguments", "TEXT", True, "none")]
    with db.connect() as conn:
        conn.execute("INSERT INTO approval_decision (workflow_id, execution_chain, tool_call_id,"
                     " tool_name, approved, reviewer, note, decided_at) VALUES ('wf', '', 'c1',"
                     " 'createEmailTask', 1, 'bob', '', '2026-12-01T00:00:00+00:00')")
        assert fetchall(conn, "SELECT reviewer, edited_arguments FROM approval_decision") == [
            {"reviewer": "bob", "edited_arguments": None}]
    downgrade_to(db, "0009")
    assert schema_of(db) == before


def test_revision_0013_audit_approval_reason_only_adds(fresh_url: str) -> None:
    """Why a call waited, on its audit row (0013_audit_approval_reason), adds
    one nullable column, nothing else; a row written as the previous
    release's worker writes it (without the column) reads it as NULL, and
    downgrading drops it again."""
    db = Database(fresh_url)
    upgrade(db, "0012_quarantined_message")
    before = schema_of(db)
    upgrade(db, "0013_audit_approval_reason")
    after = schema_of(db)
    assert {t: after[t] for t in before if t != "tool_execution_log"} == {
        t: shape for t, shape in before.items() if t != "tool_execution_log"}
    old, new = before["tool_execution_log"], after["tool_execution_log"]
    assert {k: v for k, v in new.items() if k != "columns"} == {
        k: v for k, v in old.items() if k != "columns"}
    assert new["columns"] == [*old["columns"], ("approval_reason", "TEXT", True, "none")]
    with db.connect() as conn:
        conn.execute("INSERT INTO tool_execution_log (execution_id, workflow_id,"
                     " conversation_id, user_id, tool_name, start_time, status) VALUES"
                     " ('wf:c1', 'wf', 'conv', 'u', 'issueRefund',"
                     " '2026-12-01T00:00:00.000+00:00', 'SUCCEEDED')")
        assert fetchall(conn, "SELECT tool_name, approval_reason FROM tool_execution_log") == [
            {"tool_name": "issueRefund", "approval_reason": None}]
    downgrade_to(db, "0012_quarantined_message")
    assert schema_of(db) == before


def test_revision_0014_audit_provenance_only_adds(fresh_url: str) -> None:
    """Where a call's sensitive arguments came from, on its audit row
    (0014_audit_provenance), adds one nullable column, nothing else; a row
    written as the previous release's worker writes it reads it as NULL, and
    downgrading drops it again."""
    db = Database(fresh_url)
    upgrade(db, "0013_audit_approval_reason")
    before = schema_of(db)
    upgrade(db, "0014_audit_provenance")
    after = schema_of(db)
    assert {t: after[t] for t in before if t != "tool_execution_log"} == {
        t: shape for t, shape in before.items() if t != "tool_execution_log"}
    old, new = before["tool_execution_log"], after["tool_execution_log"]
    assert {k: v for k, v in new.items() if k != "columns"} == {
        k: v for k, v in old.items() if k != "columns"}
    assert new["columns"] == [*old["columns"], ("provenance", "TEXT", True, "none")]
    with db.connect() as conn:
        conn.execute("INSERT INTO tool_execution_log (execution_id, workflow_id,"
                     " conversation_id, user_id, tool_name, start_time, status,"
                     " approval_reason) VALUES ('wf:c1', 'wf', 'conv', 'u', 'send_money',"
                     " '2026-12-01T00:00:00.000+00:00', 'COMPLETED', NULL)")
        assert fetchall(conn, "SELECT tool_name, provenance FROM tool_execution_log") == [
            {"tool_name": "send_money", "provenance": None}]
    downgrade_to(db, "0013_audit_approval_reason")
    assert schema_of(db) == before


def downgrade_to(db: Database, revision: str) -> None:
    from alembic import command

    from turnstile.stores.schema import alembic_config

    with engine_for(db.url).begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


# The newest revision of the previous release (RELEASES.md; 0.3.0's is 0008).
PREVIOUS_RELEASE_HEAD = head_at(previous_release())


def test_revisions_after_the_previous_release_only_add(fresh_url: str) -> None:
    """Expand, then contract: what this release migrates keeps every table,
    column (with its nullability), key and index the previous release's
    worker uses; what it adds is nullable or defaulted, so that worker's
    INSERTs still succeed."""
    db = Database(fresh_url)
    upgrade(db, PREVIOUS_RELEASE_HEAD)
    before = schema_of(db)
    upgrade(db)
    after = schema_of(db)
    for table, shape in before.items():
        assert after[table]["pk"] == shape["pk"], table
        assert set(shape["columns"]) <= set(after[table]["columns"]), table
        assert set(shape["indexes"]) <= set(after[table]["indexes"]), table
    inspector = sa.inspect(db.engine)
    for table in before:
        old = {c[0] for c in before[table]["columns"]}
        for column in inspector.get_columns(table):
            if column["name"] not in old:
                assert column["nullable"] or column.get("default") is not None, (
                    table, column["name"])
