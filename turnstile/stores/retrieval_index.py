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

This module is the one writer of `retrieval_document` (and, on SQLite, of
`retrieval_fts`).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TSQUERY, TSVECTOR

from turnstile.engine.activity_io import Snippet
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.memory import now_iso
from turnstile.stores.tables import metadata, text_columns


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
    *text_columns("title", "body", "content_hash", "updated_at"),
)
doc_c = retrieval_document.c
# Not on `metadata`: the migrations make them, each engine its own way.
retrieval_fts = sa.table("retrieval_fts", *(sa.column(n, sa.Text)
                                            for n in ("service", "doc_id", "title", "body")))
fts = retrieval_fts.c
tsv = sa.column("tsv", TSVECTOR)  # retrieval_document's, on PostgreSQL


class Indexed(NamedTuple):
    doc_id: str
    content_hash: str


class Hit(NamedTuple):
    doc_id: str
    title: str
    body: str
    score: float

    def snippet(self) -> Snippet:
        return Snippet(doc_id=self.doc_id, title=self.title, text=self.body,
                       score=round(float(self.score), 6))


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
            have = dict(conn.rows(sa.select(doc_c.doc_id, doc_c.content_hash)
                                  .where(doc_c.service == service), Indexed))
            for doc in documents:
                if have.get(doc.id) != doc.content_hash():
                    self._write(conn, service, doc)
                    changed += 1
            for gone in have.keys() - wanted.keys():
                self._delete(conn, service, gone)
                changed += 1
        return changed

    def _write(self, conn: Connection, service: str, doc: Document) -> None:
        conn.upsert(retrieval_document, {
            "service": service, "doc_id": doc.id, "title": doc.title, "body": doc.text,
            "content_hash": doc.content_hash(), "updated_at": now_iso()})
        if conn.dialect == "sqlite":
            self._delete_fts(conn, service, doc.id)
            conn.execute(sa.insert(retrieval_fts).values(
                service=service, doc_id=doc.id, title=doc.title, body=doc.text))

    def _delete(self, conn: Connection, service: str, doc_id: str) -> None:
        conn.execute(sa.delete(retrieval_document).where(doc_c.service == service,
                                                         doc_c.doc_id == doc_id))
        if conn.dialect == "sqlite":
            self._delete_fts(conn, service, doc_id)

    @staticmethod
    def _delete_fts(conn: Connection, service: str, doc_id: str) -> None:
        conn.execute(sa.delete(retrieval_fts).where(fts.service == service,
                                                    fts.doc_id == doc_id))

    def search(self, service: str, query: str, top_k: int) -> list[Snippet]:
        terms = query_terms(query)
        if not terms or top_k <= 0:
            return []
        with self.db.connect() as conn:
            stmt = (self._search_pg(service, " ".join(terms)) if conn.dialect == "postgresql"
                    else self._search_sqlite(service, terms))
            hits = conn.rows(stmt.limit(top_k), Hit)
        return [h.snippet() for h in hits]

    @staticmethod
    def _search_sqlite(service: str, terms: list[str]) -> sa.Select[tuple[str, str, str, float]]:
        # Each term quoted: user text can never be read as FTS5 query syntax.
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        table = sa.literal_column("retrieval_fts", sa.Text)  # FTS5's column named as its table
        score = (-sa.func.bm25(table, 0.0, 0.0, 2.0, 1.0)).label("score")
        return (sa.select(fts.doc_id, fts.title, fts.body, score)
                .where(table.bool_op("MATCH")(match), fts.service == service)
                .order_by(score.desc(), fts.doc_id))

    @staticmethod
    def _search_pg(service: str, text: str) -> sa.Select[tuple[str, str, str, float]]:
        # plainto_tsquery's terms are AND-ed; OR them instead.
        anded = sa.cast(sa.func.plainto_tsquery("english", text), sa.Text)
        query = sa.select(sa.cast(sa.func.replace(anded, "&", "|"), TSQUERY).label("q")) \
            .subquery("query")
        score = sa.func.ts_rank(tsv, query.c.q).label("score")
        return (sa.select(doc_c.doc_id, doc_c.title, doc_c.body, score)
                .select_from(retrieval_document.join(query, sa.true()))  # one row: q
                .where(doc_c.service == service, tsv.bool_op("@@")(query.c.q))
                .order_by(score.desc(), doc_c.doc_id))


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
