"""The reference app: a sales follow-up service — the sales query tool,
follow-up tasks, the e-mail outbox and its SMTP sender, their tables, the
documents its retriever searches, the demo seed. It sits on top of the
runtime, the stores and the engine; nothing below imports it.
"""
