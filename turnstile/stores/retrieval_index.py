"""Retrieval augmentation (step 5): the service's documents, indexed in the
project's database and searched with its full-text engine.

- SQLite: an FTS5 table (`porter unicode61` tokenizer), ranked by bm25.
- PostgreSQL: a generated `to_tsvector('english', ...)` column with a GIN
  index, queried with `plainto_tsquery` whose terms are OR-ed (a question
  rarely contains every word of the passage that answers it), ranked by ts_rank.

Documents are declared in code (`Service(documents=[...])`); the index is
brought in line with them (insert changed, delete removed, by content hash)
the first time a worker process retrieves for a service. Retrieval runs in
the `turnstile.retrieve` activity; the workflow only merges the snippets into
the user message.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from turnstile.engine.activity_io import Snippet
from turnstile.stores.db import Connection, Database, metadata
from turnstile.stores.memory import now_iso


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str

    def content_hash(self) -> str:
        return hashlib.sha256(f"{self.title}\n{self.text}".encode()).hexdigest()


@dataclass(frozen=True)
class RetrievalContext:
    db: Database
    service: str
    conversation_id: str
    user_id: str
    query: str  # the user message after its template
    raw_message: str  # the user's own words
    top_k: int


Retriever = Callable[[RetrievalContext], "Sequence[Snippet] | Awaitable[Sequence[Snippet]]"]


# The full-text side differs by engine and is made by the migrations: on
# PostgreSQL a generated `tsv` column with a GIN index, on SQLite the FTS5
# virtual table `retrieval_fts (service, doc_id, title, body)`.
retrieval_document = sa.Table(
    "retrieval_document", metadata,
    sa.Column("service", sa.Text, primary_key=True),
    sa.Column("doc_id", sa.Text, primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
)


_STOP = frozenset(
    "a an and are as at be by can could do does for from had has have how i in is it its "
    "me my of on or our please should so that the their them then there these they this "
    "to us was we what when where which who why will with would you your".split())
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def query_terms(text: str, limit: int = 32) -> list[str]:
    """Distinct lower-case words worth searching for, in order."""
    out: list[str] = []
    for w in _WORD.findall(text.lower()):
        if len(w) >= 3 and w not in _STOP and w not in out:
            out.append(w)
    return out[:limit]


class DocumentIndex:
    """The full-text index of one database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def sync(self, service: str, documents: Sequence[Document]) -> int:
        """Make the index hold exactly `documents` for `service`; returns the
        number of documents written or removed."""
        wanted = {d.id: d for d in documents}
        changed = 0
        with self.db.connect() as conn:
            have = {r["doc_id"]: r["content_hash"] for r in conn.fetchall(
                "SELECT doc_id, content_hash FROM retrieval_document WHERE service = :s",
                {"s": service})}
            for doc in documents:
                if have.get(doc.id) != doc.content_hash():
                    self._write(conn, service, doc)
                    changed += 1
            for gone in have.keys() - wanted.keys():
                self._delete(conn, service, gone)
                changed += 1
        return changed

    def _write(self, conn: Connection, service: str, doc: Document) -> None:
        conn.execute(
            "INSERT INTO retrieval_document (service, doc_id, title, body, content_hash, "
            "updated_at) VALUES (:s, :doc, :title, :body, :hash, :now) "
            "ON CONFLICT (service, doc_id) DO UPDATE "
            "SET title = excluded.title, body = excluded.body, "
            "content_hash = excluded.content_hash, updated_at = excluded.updated_at",
            {"s": service, "doc": doc.id, "title": doc.title, "body": doc.text,
             "hash": doc.content_hash(), "now": now_iso()})
        if conn.dialect == "sqlite":
            conn.execute("DELETE FROM retrieval_fts WHERE service = :s AND doc_id = :doc",
                         {"s": service, "doc": doc.id})
            conn.execute("INSERT INTO retrieval_fts (service, doc_id, title, body) "
                         "VALUES (:s, :doc, :title, :body)",
                         {"s": service, "doc": doc.id, "title": doc.title, "body": doc.text})

    def _delete(self, conn: Connection, service: str, doc_id: str) -> None:
        conn.execute("DELETE FROM retrieval_document WHERE service = :s AND doc_id = :doc",
                     {"s": service, "doc": doc_id})
        if conn.dialect == "sqlite":
            conn.execute("DELETE FROM retrieval_fts WHERE service = :s AND doc_id = :doc",
                         {"s": service, "doc": doc_id})

    def search(self, service: str, query: str, top_k: int) -> list[Snippet]:
        terms = query_terms(query)
        if not terms or top_k <= 0:
            return []
        with self.db.connect() as conn:
            rows = (self._search_pg(conn, service, " ".join(terms), top_k)
                    if conn.dialect == "postgresql"
                    else self._search_sqlite(conn, service, terms, top_k))
        return [Snippet(doc_id=r["doc_id"], title=r["title"], text=r["body"],
                        score=round(float(r["score"]), 6)) for r in rows]

    @staticmethod
    def _search_sqlite(conn: Connection, service: str, terms: list[str],
                       top_k: int) -> list[dict[str, Any]]:
        # Each term quoted: user text can never be read as FTS5 query syntax.
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        return conn.fetchall(
            "SELECT doc_id, title, body, -bm25(retrieval_fts, 0.0, 0.0, 2.0, 1.0) AS score "
            "FROM retrieval_fts WHERE retrieval_fts MATCH :match AND service = :s "
            "ORDER BY score DESC, doc_id LIMIT :k", {"match": match, "s": service, "k": top_k})

    @staticmethod
    def _search_pg(conn: Connection, service: str, text: str,
                   top_k: int) -> list[dict[str, Any]]:
        return conn.fetchall(
            "SELECT doc_id, title, body, ts_rank(tsv, query.q) AS score "
            "FROM retrieval_document CROSS JOIN (SELECT replace(plainto_tsquery('english', "
            ":words)::text, '&', '|')::tsquery AS q) AS query "
            "WHERE service = :s AND tsv @@ query.q ORDER BY score DESC, doc_id LIMIT :k",
            {"words": text, "s": service, "k": top_k})


class FullTextRetriever:
    """The default retriever of a service that declares `documents`."""

    name = "full_text"

    def __init__(self, documents: Sequence[Document]) -> None:
        ids = [d.id for d in documents]
        if len(set(ids)) != len(ids):
            raise ValueError(f"document ids must be unique: {ids}")
        self.documents = list(documents)
        self._synced: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, ctx: RetrievalContext) -> list[Snippet]:
        index = DocumentIndex(ctx.db)
        key = (ctx.db.url, ctx.service)
        with self._lock:  # one sync per database and service per process
            if key not in self._synced:
                index.sync(ctx.service, self.documents)
                self._synced.add(key)
        return index.search(ctx.service, ctx.query, ctx.top_k)


def within_budget(snippets: Sequence[Snippet], max_chars: int) -> list[Snippet]:
    """Best snippets first until `max_chars` of text; the last one is cut."""
    out: list[Snippet] = []
    left = max_chars
    for s in snippets:
        if left <= 0:
            break
        text = s.text if len(s.text) <= left else s.text[: max(0, left - 1)] + "…"
        out.append(s.model_copy(update={"text": text}))
        left -= len(text)
    return out
