"""One rule for every activity's errors: retried only when a retry can help.

An activity's attempt that raises anything but a Temporal failure is, by
Temporal's default, retried for the activity's whole retry window (an hour
for memory and bookkeeping). That is right for an outage — the network, a
timeout, a database that is down or locked, a conversation another turn
holds — and wrong for an error the same data raises on every attempt: it
would hold its turn, and the turn its conversation, for that whole window.

This worker interceptor (`DataErrors`, registered on every Turnstile worker:
worker.build_worker) classifies what escapes an activity, wherever it
surfaces (raised directly, or as the cause of another error):

- a damaged stored row (turnstile.stores.damage: text that is not UTF-8 on
  SQLite, JSON of the wrong shape, a role that is none) → non-retryable
  `DamagedRow`, naming the conversation and the row's `seq` — also when the
  driver's decode error (an OperationalError, otherwise retried) lies beneath;
- the database refusing the data itself (PostgreSQL's NUL in text, a value
  too long for its column, a NOT NULL or CHECK violation) → non-retryable
  `DatabaseRefusedData`;
- data no retry can read (pydantic validation and serialization errors,
  decoding and encoding errors, a value of the wrong type or shape:
  TypeError, KeyError, IndexError, AttributeError, ValueError, a recursion
  too deep, a broken assertion) → non-retryable `UnreadableData`, naming the
  activity and what it could not read;
- everything else (OSError and its network errors, timeouts, the driver's
  OperationalError, an ApplicationError the activity raised itself, e.g.
  `ConversationBusy`, `DatabaseUnavailable`) → left as it is: retried by the
  activity's retry policy, or decided by the activity.

docs/errors.md holds the table. The driver's text (it can quote the value and
the SQL) goes to the log, not to the failure; the failure's text is bounded
and has no NUL or lone surrogate. The log gets the driver's primary message
and the constraint it names (turnstile.stores.db_errors), never
`DETAIL: Failing row contains (...)`.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from typing import Any

import pydantic
from sqlalchemy import exc
from temporalio import activity
from temporalio.exceptions import ApplicationError, FailureError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from turnstile.engine.errors import DamagedRow, DatabaseRefusedData, UnreadableData
from turnstile.engine.masking import mask_text
from turnstile.engine.safe_text import safe_text
from turnstile.stores.db_errors import db_error_text

log = logging.getLogger(__name__)

# IntegrityError texts that mean "this value", not "this race" (a unique key
# taken by a concurrent writer can succeed on retry and is left alone).
_DATA_VIOLATIONS = ("not null", "not-null", "check constraint", "datatype mismatch")

# Transient, whatever they wrap: an outage or a timeout, retried.
TRANSIENT: tuple[type[BaseException], ...] = (
    OSError, TimeoutError, asyncio.TimeoutError, exc.OperationalError, exc.InterfaceError,
    exc.DisconnectionError, exc.TimeoutError, sqlite3.OperationalError)

# The same data raises them on every attempt: not retried. (UnicodeError,
# json.JSONDecodeError and pydantic_core's PydanticSerializationError are
# ValueErrors; KeyError and IndexError are LookupErrors.)
UNREADABLE: tuple[type[BaseException], ...] = (
    pydantic.ValidationError, ValueError, TypeError, LookupError, AttributeError,
    RecursionError, AssertionError)

_MESSAGE_MAX = 300


def _chain(err: BaseException) -> list[BaseException]:
    """`err`, then what it was raised from or while handling (a driver's
    error wrapped by SQLAlchemy, by our own typed errors), at most 8 deep."""
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and all(current is not s for s in seen) and len(seen) < 8:
        seen.append(current)
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else (
            current.__cause__ or current.__context__)
    return seen


def refused_data(err: BaseException) -> str | None:
    """A short category when `err` (or an error it was raised from) is the
    database refusing the data itself, else None."""
    for current in _chain(err):
        if isinstance(current, exc.DataError):
            return "the database refused a value (a data error)"
        if isinstance(current, exc.IntegrityError | sqlite3.IntegrityError):
            text = str(getattr(current, "orig", current)).lower()
            if any(v in text for v in _DATA_VIOLATIONS):
                return "the database refused a value (a NOT NULL or CHECK constraint)"
    return None


def unreadable(err: BaseException) -> BaseException | None:
    """The error in `err`'s chain that says the data cannot be read, or None
    when a retry may help (an outage, a timeout, or nothing we know)."""
    chain = _chain(err)
    if any(isinstance(e, TRANSIENT) for e in chain):
        return None
    return next((e for e in chain if isinstance(e, UNREADABLE)), None)


def what_was_unread(err: BaseException) -> str:
    """What the activity could not read, in words: bounded, storable, masked."""
    if isinstance(err, pydantic.ValidationError) and err.error_count():
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the value)"
        text = f"{err.title} at {where}: {first['msg']}"
    elif isinstance(err, KeyError):
        text = f"the key {err.args[0]!r}" if err.args else "a key"
    else:
        text = str(err) or "its data"
    return mask_text(safe_text(text))[:_MESSAGE_MAX]


def classified(err: BaseException, activity_type: str) -> ApplicationError | None:
    """The non-retryable failure `err` stands for, or None: raise it as it is."""
    if isinstance(err, asyncio.CancelledError):
        return None
    damaged = next((e for e in _chain(err) if isinstance(e, DamagedRow)), None)
    if damaged is not None:
        return ApplicationError(mask_text(safe_text(str(damaged)))[:_MESSAGE_MAX * 2],
                                type=DamagedRow.error_type, non_retryable=True)
    # A refusal of the data by the database, also beneath an error the activity
    # raised (e.g. CallNotRecorded), is the same on every attempt.
    category = refused_data(err)
    if category is not None and not (isinstance(err, ApplicationError) and err.non_retryable):
        return ApplicationError(f"{category}; retrying cannot help",
                                type=DatabaseRefusedData.error_type, non_retryable=True)
    if isinstance(err, FailureError):
        return None  # the activity decided (ApplicationError)
    bad = unreadable(err)
    if bad is None:
        return None
    return ApplicationError(
        f"{activity_type} could not read {what_was_unread(bad)} ({type(bad).__name__}); "
        "retrying cannot help", type=UnreadableData.error_type, non_retryable=True)


class DataErrors(Interceptor):
    """Registered on every Turnstile worker (worker.build_worker)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except Exception as err:
            info = activity.info()
            failure = classified(err, info.activity_type)
            if failure is None:
                raise
            log.warning("%s failed for good in attempt %d: %s: %s", info.activity_type,
                        info.attempt, type(err).__name__, db_error_text(err))
            raise failure from None
