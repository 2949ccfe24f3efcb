"""The clock the outbox's sender reads and waits on.

The sender's backoff lives in the rows (`next_attempt_at`, `claimed_at`),
stamped from the clock; a test hands a clock it moves by hand instead of
waiting out the real delays (tests/test_sales_sender.py)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time (timezone-aware, UTC)."""
        ...

    def sleep(self, seconds: float, until: threading.Event | None = None) -> bool:
        """Wait `seconds`, or less once `until` is set; True when it was set."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float, until: threading.Event | None = None) -> bool:
        if until is not None:
            return until.wait(seconds)
        time.sleep(seconds)
        return False


SYSTEM_CLOCK = SystemClock()
