"""The stored form of a timestamp in the apps' tables (the sales app's, the
public outbox's): ISO-8601 UTC text of fixed width
(`2025-03-03T09:15:00.000000Z`) on both backends. Fixed width + UTC + the "C"
collation on PostgreSQL make text order equal time order."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

# Timestamps: fixed-width ISO text; "C" collation on PostgreSQL (byte order).
Ts = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def utc_text(moment: datetime) -> str:
    """The stored form of a timestamp (naive datetimes are taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    # isoformat, not strftime: it always pads the year to four digits.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def now_text() -> str:
    return utc_text(datetime.now(UTC))
