"""`Connection.execute` takes what SQLAlchemy's takes: one mapping, or a list
of mappings (executemany), inside a tool's transaction and in
`db.connect()`, on both databases."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from turnstile.runtime.tools import ToolContext
from turnstile.stores.db import Database

META = sa.MetaData()
shelf = sa.Table("many_test_shelf", META, sa.Column("book_id", sa.String(20), primary_key=True),
                 sa.Column("title", sa.String(100), nullable=False))
ROWS = [{"book_id": f"B-{n}", "title": f"Book {n}"} for n in range(5)]


def titles(db: Database) -> list[str]:
    with db.connect() as conn:
        return list(conn.execute(sa.select(shelf.c.title).order_by(shelf.c.book_id)).scalars())


def test_a_list_of_rows_is_executemany_in_both_places(db: Database) -> None:
    META.create_all(db.engine)
    with db.connect() as conn:
        conn.execute(sa.delete(shelf))
        conn.execute(sa.insert(shelf), ROWS[:2])
        conn.execute("UPDATE many_test_shelf SET title = :title WHERE book_id = :book_id",
                     [{"book_id": "B-0", "title": "First"}, {"book_id": "B-1", "title": "Second"}])
    ctx = ToolContext(db=db, workflow_id="w", conversation_id="c", user_id="u",
                      tool_call_id="t")
    with ctx.transaction() as conn:
        result = conn.execute(sa.insert(shelf), ROWS[2:])
        assert result.rowcount in (3, -1)  # the driver's count of an executemany
        assert conn.execute(sa.select(sa.func.count()).select_from(shelf)).scalar() == 5
    assert titles(db) == ["First", "Second", "Book 2", "Book 3", "Book 4"]
    with db.connect() as conn, pytest.raises(TypeError, match="mapping or a list of mappings"):
        conn.execute(sa.insert(shelf), "B-9")  # type: ignore[arg-type]
    META.drop_all(db.engine)
