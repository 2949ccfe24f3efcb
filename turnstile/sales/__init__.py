"""The reference app: a sales follow-up service — the sales query tool,
follow-up tasks, e-mail through the public outbox (turnstile.outbox, on
`email_task`), their tables, the
documents its retriever searches, the demo seed and the offline demo
planner's script. It sits on top of the runtime, the stores and the engine;
nothing below imports it: worker.py, starter.py and `python -m turnstile.db`
hand what it brings to the runtime explicitly (`turnstile.sales.app`).
"""
