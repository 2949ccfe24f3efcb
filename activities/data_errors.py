"""Database refusals caused by the data are never retried as outages.

A value the database cannot take (PostgreSQL's NUL in text, a value too long
for its column, a NOT NULL or CHECK violation) fails the same way on every
attempt: retried as if the database were down, it would hold its turn — and
the turn its conversation — for the activity's whole retry window. This
worker interceptor turns such an error, wherever it surfaces in an activity
(raised directly or as the cause of another error), into a non-retryable
`ApplicationError` of type `DatabaseRefusedData`. The driver's text (it can
quote the value and the SQL) goes neither to the failure nor to the log:
the log gets the driver's primary message and the constraint it names
(turnstile.stores.db_errors), never `DETAIL: Failing row contains (...)`.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from sqlalchemy import exc
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from turnstile.engine.errors import DatabaseRefusedData
from turnstile.stores.db_errors import db_error_text

log = logging.getLogger(__name__)

# IntegrityError texts that mean "this value", not "this race" (a unique key
# taken by a concurrent writer can succeed on retry and is left alone).
_DATA_VIOLATIONS = ("not null", "not-null", "check constraint", "datatype mismatch")


def refused_data(err: BaseException) -> str | None:
    """A short category when `err` (or an error it was raised from) is the
    database refusing the data itself, else None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        if isinstance(current, exc.DataError):
            return "the database refused a value (a data error)"
        if isinstance(current, exc.IntegrityError | sqlite3.IntegrityError):
            text = str(getattr(current, "orig", current)).lower()
            if any(v in text for v in _DATA_VIOLATIONS):
                return "the database refused a value (a NOT NULL or CHECK constraint)"
        current = current.__cause__ or current.__context__
    return None


class DataErrors(Interceptor):
    """Registered on every Turnstile worker (worker.build_worker)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except Exception as err:
            category = refused_data(err)
            if category is None:
                raise
            info = activity.info()
            log.warning("%s refused data in attempt %d: %s", info.activity_type,
                        info.attempt, db_error_text(err))
            raise ApplicationError(f"{category}; retrying cannot help",
                                   type=DatabaseRefusedData.error_type,
                                   non_retryable=True) from None
