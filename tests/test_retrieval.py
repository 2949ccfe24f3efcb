"""The full-text document index on both databases: SQLite FTS5 and
PostgreSQL to_tsvector/plainto_tsquery."""

from __future__ import annotations

import pytest

from turnstile.sales.documents import SALES_DOCUMENTS
from turnstile.stores.db import Database
from turnstile.stores.retrieval_index import (
    Document,
    DocumentIndex,
    FullTextRetriever,
    RetrievalContext,
)

pytest_plugins = ["tests.support.databases"]

DOCS = [
    Document("follow-up", "Follow-up policy",
             "Key accounts get a personal follow-up call within two business days."),
    Document("etiquette", "E-mail etiquette",
             "Keep e-mails short: a greeting, the reason, one clear next step."),
    Document("returns", "Returns", "Goods may be returned within thirty days."),
]


def test_search_ranks_by_relevance_and_stems(db: Database) -> None:
    index = DocumentIndex(db)
    assert index.sync("svc", DOCS) == 3
    hits = index.search("svc", "What are the policies for following up with accounts?", 3)
    assert hits[0].doc_id == "follow-up"  # "policies"→policy, "following"→follow: stemmed
    assert "returns" not in [h.doc_id for h in hits]
    assert index.search("svc", "greeting in e-mails", 1)[0].doc_id == "etiquette"
    assert index.search("svc", "quantum chromodynamics", 3) == []
    assert index.search("other-service", "follow-up", 3) == []  # per service


def test_query_syntax_in_user_text_is_harmless(db: Database) -> None:
    index = DocumentIndex(db)
    index.sync("svc", DOCS)
    for text in ['"unbalanced', "NEAR(a b) OR * AND NOT", "title:returns", "a & b | !c", "?"]:
        index.search("svc", text, 3)  # must not raise
    assert index.search("svc", 'returned"; DROP TABLE retrieval_document; --', 3)[0].doc_id \
        == "returns"


def test_sync_follows_the_declared_documents(db: Database) -> None:
    index = DocumentIndex(db)
    index.sync("svc", DOCS)
    assert index.sync("svc", DOCS) == 0  # unchanged: nothing written
    changed = [Document("follow-up", "Follow-up policy", "Call key accounts within a week."),
               DOCS[1]]
    assert index.sync("svc", changed) == 2  # one rewritten, one removed
    assert index.search("svc", "returned goods", 3) == []
    assert index.search("svc", "business days", 3) == []
    assert index.search("svc", "week", 3)[0].doc_id == "follow-up"


def test_retriever_syncs_once_per_process(db: Database,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[str] = []
    real_sync = DocumentIndex.sync

    def counting_sync(self: DocumentIndex, service: str, documents: list[Document]) -> int:
        syncs.append(service)
        return real_sync(self, service, documents)

    monkeypatch.setattr(DocumentIndex, "sync", counting_sync)
    retriever = FullTextRetriever(DOCS)
    ctx = RetrievalContext(db=db, service="svc", conversation_id="c", user_id="u",
                           query="returns within thirty days", raw_message="", top_k=2)
    assert retriever(ctx)[0].doc_id == "returns"
    assert retriever(ctx)[0].doc_id == "returns"
    assert syncs == ["svc"]


def test_sales_documents_answer_the_scenario(db: Database) -> None:
    index = DocumentIndex(db)
    index.sync("sales-assistant", SALES_DOCUMENTS)
    hits = index.search("sales-assistant", "Find customers whose sales last week exceeded "
                        "50,000 and email ops@example.com to follow up", 2)
    assert {h.doc_id for h in hits} <= {d.id for d in SALES_DOCUMENTS} and hits
