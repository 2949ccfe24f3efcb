"""The shape of a database's schema, for tests that compare schemas
(tests/test_migrations.py, tests/test_revisions_only_add.py)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from turnstile.stores.db import Database
from turnstile.stores.engines import engine_for

# The migrator's own tables (Alembic's revision, turnstile.stores.schema_window's
# records), not the schema a revision makes.
BOOKKEEPING = frozenset({"alembic_version", "schema_revision"})


def schema_of(db: Database) -> dict[str, Any]:
    """Tables, columns (type, nullability, default), keys and indexes (the
    migrator's bookkeeping left out)."""
    with engine_for(db.url).connect() as conn:
        insp = sa.inspect(conn)
        out: dict[str, Any] = {}
        for table in sorted(set(insp.get_table_names()) - BOOKKEEPING):
            out[table] = {
                "columns": [(c["name"], str(c["type"]), c["nullable"],
                             str(c.get("default")).replace("'", "").lower())
                            for c in insp.get_columns(table)],
                "pk": insp.get_pk_constraint(table)["constrained_columns"],
                "unique": sorted(tuple(u["column_names"])
                                 for u in insp.get_unique_constraints(table)),
                "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                                  for i in insp.get_indexes(table)),
                "checks": sorted(c["sqltext"] for c in insp.get_check_constraints(table)),
            }
        return out
