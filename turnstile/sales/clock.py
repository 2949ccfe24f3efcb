"""The sender's clock (turnstile.outbox.clock), under the name the sales
app's tests and benches use."""

from __future__ import annotations

from turnstile.outbox.clock import (
    SYSTEM_CLOCK as SYSTEM_CLOCK,
    Clock as Clock,
    SystemClock as SystemClock,
)
