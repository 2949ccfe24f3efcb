"""What a log may say of a database error (turnstile.stores.db_errors,
docs/masking.md): the constraint it names, never the row it refused — from a
real CHECK and UNIQUE violation on SQLite and PostgreSQL, written by us or
logged by anyone with its traceback."""

from __future__ import annotations

import logging
import sys

import pytest

from turnstile.engine.masking import without_db_details
from turnstile.runtime.log_masking import MaskingFilter
from turnstile.stores.db import Database
from turnstile.stores.db_errors import db_error_text

SEED = "zq7row"


def _violations(db: Database) -> list[Exception]:
    with db.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t_detail (v TEXT PRIMARY KEY, "
                     "n INTEGER CHECK (n > 0))")
        conn.execute("INSERT INTO t_detail VALUES (:v, 1)", {"v": f"{SEED}@example.com"})
    errors: list[Exception] = []
    for v, n in ((f"{SEED}2@example.com", -1), (f"{SEED}@example.com", 1)):
        try:
            with db.connect() as conn:
                conn.execute("INSERT INTO t_detail VALUES (:v, :n)", {"v": v, "n": n})
        except Exception as err:  # noqa: BLE001 - the driver's error is what is tested
            errors.append(err)
    assert len(errors) == 2
    return errors


def test_a_refused_row_is_named_never_quoted(db: Database) -> None:
    check, unique = _violations(db)
    if db.dialect == "postgresql":  # the driver's own text quotes the row
        assert "Failing row contains" in str(check) and SEED in str(check)
        assert "Key (v)=" in str(unique) and SEED in str(unique)
    for err, constraint in ((check, "check"), (unique, "unique")):
        text = db_error_text(err)
        assert SEED not in text and "DETAIL" not in text and "[SQL" not in text, text
        assert constraint in text.lower() or "t_detail" in text, text
        wrapped = RuntimeError("while storing")
        wrapped.__cause__ = err
        assert db_error_text(wrapped) == text  # found as the cause too


def test_the_log_filter_removes_details_whoever_logs(db: Database) -> None:
    check, _ = _violations(db)
    try:
        raise RuntimeError("step failed") from check
    except RuntimeError:
        record = logging.LogRecord("temporalio.activity", logging.WARNING, __file__, 1,
                                   "Completing activity as failed: %s", (repr(check),),
                                   exc_info=True)
        record.exc_info = sys.exc_info()
    assert MaskingFilter().filter(record)
    written = logging.Formatter().format(record)
    assert "step failed" in written and "Traceback" in written
    assert "Failing row contains" not in written and "Key (v)=" not in written, written
    assert f"{SEED}2@" not in written and f"{SEED}@" not in written


@pytest.mark.parametrize(("text", "kept"), [
    ("ERROR:  x\nDETAIL:  Failing row contains (a, 1).\nHINT:  y", "ERROR:  x\nDETAIL: [removed]"
     "\nHINT: [removed]"),
    ("(CheckViolation) x\\nDETAIL:  Failing row contains (a).\\n[SQL: INSERT 1]",
     "(CheckViolation) x\\nDETAIL: [removed]\\n[SQL: removed]"),
    ("the WHERE: clause of a sentence stays", "the WHERE: clause of a sentence stays"),
    ("UNIQUE constraint failed: t.v", "UNIQUE constraint failed: t.v"),
])
def test_without_db_details(text: str, kept: str) -> None:
    assert without_db_details(text) == kept
