"""The public outbox: durable outbound e-mail any app adds (docs/outbox.md).

- `component` — `Outbox`: the table, `enqueue`/`cancel`/`status` for tools,
  the sender as the app's background process, the local SMTP dev service;
- `store` — the state machine on an outbox table (compare-and-set changes);
- `sender` — one delivery pass and the loop (exactly-once hand-off, retries,
  dead letters, "possibly sent");
- `smtp_server` — the local SMTP server of the dev stack and the tests;
- `table`, `clock` — the table's declaration, the sender's clock.

Layer: above the runtime (it uses tools, apps, the tool roles), below the apps.
"""

from __future__ import annotations

from turnstile.outbox.component import Outbox as Outbox
from turnstile.outbox.sender import SenderConfig as SenderConfig
from turnstile.outbox.store import (
    POSSIBLY_SENT as POSSIBLY_SENT,
    EmailStatus as EmailStatus,
    EmailTask as EmailTask,
)

__all__ = ["POSSIBLY_SENT", "EmailStatus", "EmailTask", "Outbox", "SenderConfig"]
