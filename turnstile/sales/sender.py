"""The sales app's e-mail sender: the public outbox's (turnstile.outbox.sender)
on `email_task`. `deliver_due` and `run_sender` here are bound to that table."""

from __future__ import annotations

import threading

from turnstile.outbox import sender as _sender
from turnstile.outbox.sender import (
    DEAD_COUNTER as DEAD_COUNTER,
    DeliveryError as DeliveryError,
    SenderConfig as SenderConfig,
    SmtpSession as SmtpSession,
    build_message as build_message,
)
from turnstile.runtime.config import Settings
from turnstile.sales.schema import EMAIL_OUTBOX
from turnstile.stores.db import Database


def deliver_due(db: Database, settings: Settings, config: SenderConfig | None = None,
                stop: threading.Event | None = None) -> int:
    """One pass over `email_task` (turnstile.outbox.sender.deliver_due)."""
    return _sender.deliver_due(EMAIL_OUTBOX.store, db, settings, config, stop)


def run_sender(db: Database, settings: Settings, stop_event: threading.Event,
               poll_interval: float = 0.5, config: SenderConfig | None = None) -> None:
    """The loop over `email_task` (turnstile.outbox.sender.run_sender)."""
    _sender.run_sender(EMAIL_OUTBOX.store, db, settings, stop_event, poll_interval, config)
