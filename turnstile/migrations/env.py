"""Alembic environment: runs on the connection `turnstile.stores.schema`
hands over (already in a transaction, holding the upgrade lock)."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
