"""Alembic migrations of every table the project owns (stores and the sales
app). Hand-written revisions under `versions/`, run by
`turnstile.stores.schema.upgrade` (the worker and `starter.py seed` call it on
start; operators run `python -m turnstile.db upgrade`). Revision 0001 is
exactly the schema v0.1.0 created; a database v0.1 made is recognised and
stamped at 0001 before the later revisions run."""
