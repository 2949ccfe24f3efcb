"""Turnstile: durable, auditable LLM tool-calling turns on Temporal.

Five layers; arrows point one way (a lower layer never imports a higher one,
and `tests/test_layers.py` fails on a violation or an import cycle):

    app      turnstile.sales      the reference sales/e-mail service
    activity activities/          the activity names, wired to the runtime, stores, providers
    runtime  turnstile.runtime    config, services, apps, plugins, tools, tracing, client, dev stack
             turnstile.providers  model providers (OpenAI-compatible HTTP, offline demo planner)
    stores   turnstile.stores     database, memory, ledger, audit, lock, payloads, streaming, RAG
    engine   turnstile.engine     messages, specs, policies, rules, breakers, errors, events, wire

`workflows/` imports only the engine; `worker.py` and `starter.py` sit on
top and hand the app to the runtime explicitly (`turnstile.sales.app`:
services, tables and their privileges, demo script, dev services; see
turnstile.runtime.apps). Outside the layers: `turnstile.migrations` (Alembic
revisions of every component's tables; they import no project module) and
`turnstile.db` (the operator's `python -m turnstile.db
upgrade|current|query-window`, which passes the app on too).
"""
