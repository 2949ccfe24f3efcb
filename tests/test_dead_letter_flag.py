"""A dead letter raises a flag: an e-mail task that ends DEAD logs at error
level and increments `turnstile.email.dead`, read here with the OpenTelemetry
SDK's in-memory metric reader; over real SMTP (a refusing server) and with no
server at all (attempts exhausted)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.test_sales_sender import FAST, _Refusing, queue
from turnstile.runtime.config import Settings
from turnstile.sales.outbox import EmailStatus
from turnstile.sales.sender import DEAD_COUNTER, SenderConfig, deliver_due
from turnstile.stores.db import Database


def dead_counts(reader: InMemoryMetricReader) -> dict[str, int]:
    """reason -> count of `turnstile.email.dead` (empty: never incremented)."""
    data = reader.get_metrics_data()
    counts: dict[str, int] = {}
    for resource in (data.resource_metrics if data else []):
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == DEAD_COUNTER:
                    for point in metric.data.data_points:
                        counts[str(point.attributes["reason"])] = int(point.value)  # type: ignore[index, attr-defined]
    return counts


@pytest.fixture
def settings(unused_tcp_port: int) -> Settings:
    return Settings.from_env({"SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(unused_tcp_port)})


def test_permanent_refusal_counts_one_dead_letter(db: Database, settings: Settings,
                                                  caplog: Any) -> None:
    reader = InMemoryMetricReader()
    config = SenderConfig(**FAST, meter_provider=MeterProvider(metric_readers=[reader]))
    controller = Controller(_Refusing(), hostname="127.0.0.1", port=settings.smtp_port)
    controller.start()
    try:
        tasks = queue(db, 2)
        with caplog.at_level(logging.ERROR, logger="turnstile.sales.sender"):
            deliver_due(db, settings, config)
    finally:
        controller.stop()
    assert dead_counts(reader) == {"permanent": 2}
    flagged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert {t.task_id for t in tasks} == {r.args[0] for r in flagged}  # type: ignore[index]
    assert all("DEAD" in r.getMessage() and "550" in r.getMessage() for r in flagged)
    text = "".join(r.getMessage() for r in flagged)
    assert "ops0@example.com" not in text and "ops1@example.com" not in text  # masked


def test_attempts_exhausted_counts_once_not_per_attempt(db: Database,
                                                        settings: Settings) -> None:
    reader = InMemoryMetricReader()
    config = SenderConfig(**FAST, meter_provider=MeterProvider(metric_readers=[reader]))
    (task,) = queue(db, 1)  # no SMTP server at all
    for expected in (EmailStatus.FAILED, EmailStatus.FAILED, EmailStatus.DEAD):
        time.sleep(0.11)
        deliver_due(db, settings, config)
        assert dead_counts(reader) == ({"attempts exhausted": 1}
                                       if expected is EmailStatus.DEAD else {})
    time.sleep(0.2)
    deliver_due(db, settings, config)  # a DEAD task is not picked up again
    assert dead_counts(reader) == {"attempts exhausted": 1}
