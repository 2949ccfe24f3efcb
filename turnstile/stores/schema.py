"""Create every registered table and index that is missing.

The table owners register their DDL with `turnstile.stores.db.schema`; this
module imports the stores' owners so they are registered. The reference
app's tables register when `turnstile.sales.schema` is imported (the worker
and the seed do).
"""

from __future__ import annotations

import threading

import turnstile.stores.audit  # noqa: F401
import turnstile.stores.lock  # noqa: F401
import turnstile.stores.memory  # noqa: F401
import turnstile.stores.payload_store  # noqa: F401
import turnstile.stores.retrieval_index  # noqa: F401
import turnstile.stores.streaming  # noqa: F401
from turnstile.stores.db import Database, registered_schema

_lock = threading.Lock()


def ensure_schema(db: Database) -> None:
    with _lock, db.connect() as conn:
        if db.dialect == "postgresql":
            # Serialise concurrent schema creation by several workers.
            conn.execute("SELECT pg_advisory_xact_lock(7262010)")
        for provider in registered_schema():
            for stmt in provider(db.dialect):
                conn.execute(stmt)
