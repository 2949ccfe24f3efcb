"""Turnstile: durable, auditable LLM tool-calling turns on Temporal.

Four layers; arrows point one way (a lower layer never imports a higher one,
and `tests/test_layers.py` fails on a violation or an import cycle):

    app      turnstile.sales      the reference sales/e-mail service
    runtime  turnstile.runtime    config, services, plugins, tools, tracing, client, dev stack
             turnstile.providers  model providers (OpenAI-compatible HTTP, offline demo planner)
    stores   turnstile.stores     database, memory, ledger, audit, lock, payloads, streaming, RAG
    engine   turnstile.engine     messages, specs, policies, rules, breakers, errors, events, wire

`workflows/` imports only the engine; `activities/` wire the stores,
providers and runtime to the activity names; `worker.py` and `starter.py` sit
on top. Outside the layers: `turnstile.migrations` (Alembic revisions of every
component's tables; they import no project module) and `turnstile.db` (the
operator's `python -m turnstile.db upgrade|current|query-window`).
"""
