"""`Transaction`: one connection in one transaction that its owner ends
(the call journal's transaction of one tool attempt)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import exc

from turnstile.stores.connection import Connection
from turnstile.stores.db_errors import unavailable

if TYPE_CHECKING:
    from turnstile.stores.db import Database



class Transaction:
    """One connection in one transaction, opened on first use and ended by its
    owner — `commit()` or `release()` — not by a with-block: the call
    journal's transaction of one tool attempt (turnstile.stores.journal),
    which the tool's own statements and the journal's record share.

    On SQLite it begins `BEGIN IMMEDIATE`: the write lock is taken at the
    start, and the driver's autocommit-until-the-first-write (a savepoint
    before any write would otherwise commit at its release) cannot split it.

    Used by one thread at a time (a sync tool's thread, then the activity's).
    `release()` while another thread is inside `use()` — the activity was
    cancelled while its tool still runs in a thread — leaves the rollback to
    that thread, as it leaves; `use()` after `release()` raises
    `TransactionEnded`."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._sa: sa.Connection | None = None
        self._users = 0
        self._used = self._ended = False
        self._lock = threading.Lock()

    @property
    def used(self) -> bool:
        """A statement block was opened in it (it may have ended since)."""
        with self._lock:
            return self._used

    @contextmanager
    def use(self) -> Iterator[Connection]:
        with self._lock:
            if self._ended:
                raise TransactionEnded("this attempt's transaction has ended (the activity "
                                       "was cancelled or finished)")
            if self._sa is None:
                self._sa = self._open()
            self._used = True
            self._users += 1
            sa_conn = self._sa
        try:
            yield Connection(sa_conn, self.db.dialect)
        except exc.DBAPIError as err:
            if err.connection_invalidated:
                raise unavailable(err, self.db.dialect, False) from err
            raise
        finally:
            with self._lock:
                self._users -= 1
                if self._ended and self._users == 0:
                    self._close(commit=False)

    def _open(self) -> sa.Connection:
        self.db.transaction_opening()  # Database.call stays off the loop until closed
        opened = False
        try:
            try:
                sa_conn = self.db.engine.connect()
            except (exc.OperationalError, exc.InterfaceError) as err:
                raise unavailable(err, self.db.dialect, False) from err
            try:
                sa_conn.begin()
                if self.db.dialect == "sqlite":
                    sa_conn.exec_driver_sql("BEGIN IMMEDIATE")
            except exc.DBAPIError as err:
                sa_conn.close()
                if err.connection_invalidated or isinstance(err, exc.OperationalError):
                    raise unavailable(err, self.db.dialect, False) from err
                raise
            opened = True
            return sa_conn
        finally:
            if not opened:
                self.db.transaction_closed()

    def commit(self) -> None:
        """Commit what ran in it (nothing if nothing did) and end it."""
        with self._lock:
            if self._users:
                raise RuntimeError("commit while a statement block is still open")
            self._ended = True
            self._close(commit=True)

    def release(self) -> None:
        """End it without committing: roll back now, or as the thread still
        inside `use()` leaves. Idempotent; a no-op after `commit()`."""
        with self._lock:
            self._ended = True
            if self._users == 0:
                self._close(commit=False)

    def _close(self, *, commit: bool) -> None:
        sa_conn, self._sa = self._sa, None
        if sa_conn is None:
            return
        try:
            tx = sa_conn.get_transaction()
            if tx is not None and tx.is_active:
                if commit:
                    tx.commit()
                else:
                    tx.rollback()
        finally:
            try:
                sa_conn.close()
            finally:
                self.db.transaction_closed()


class TransactionEnded(RuntimeError):
    """A statement block was asked of a Transaction that has ended."""

