"""TURNSTILE_STICKY_QUEUE_TIMEOUT_SECONDS: how long a turn's workflow task
waits on its (lost) worker's sticky queue before another worker replays it
(worker.build_worker; the history of a kill: tests/test_worker_loss.py)."""

from __future__ import annotations

import pytest

from turnstile.engine.errors import ConfigurationError
from turnstile.runtime.config import Settings

NAME = "TURNSTILE_STICKY_QUEUE_TIMEOUT_SECONDS"


def test_unset_it_is_the_sdks_default() -> None:
    assert Settings.from_env({}).sticky_queue_timeout_seconds == 10.0
    assert Settings.from_env({NAME: " "}).sticky_queue_timeout_seconds == 10.0


@pytest.mark.parametrize(("value", "seconds"), [("3", 3.0), ("0.5", 0.5), (" 30 ", 30.0)])
def test_a_positive_number_of_seconds(value: str, seconds: float) -> None:
    assert Settings.from_env({NAME: value}).sticky_queue_timeout_seconds == seconds


@pytest.mark.parametrize("bad", ["0", "-1", "soon", "3s", "nan", "inf"])
def test_anything_else_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{NAME} must be a positive number"):
        Settings.from_env({NAME: bad})
