"""The schema compatibility window: when code older than the database may run.

Each migration (turnstile/migrations/versions) declares
`compatible_with_previous`: True when it only adds — tables, nullable or
defaulted columns, indexes, triggers that keep a table of its own — so code
that ran on the revision before it runs on it unchanged; False when it
changes or removes something older code uses (a key, a column, a type). A
migration that declares nothing counts as False. Compatibility composes: code
whose newest revision is R runs on a database at any later revision when every
revision after R is compatible.

Older code does not have the newer migration files, so the database carries
the declarations: `schema_revision`, one row per revision the database went
through (its parents, its declaration, when it was recorded), written by the
migrator (`record`, turnstile.stores.schema.upgrade) in the transaction that
migrates. Older code reads them (`newer_revisions`): from the database's
revision back, parent by parent, to the first revision its own code knows.
Every one compatible: the worker starts on the newer schema and migrates
nothing (`NewerSchema` otherwise, naming the revision that stops it). A
revision with no row — a database migrated by a release before this
mechanism (0.4.0), which wrote none — stops it too: nothing says it is safe.

The table is the migrator's bookkeeping, beside Alembic's `alembic_version`:
made by the migrator (not by a revision, so it exists whatever revision a
branch adds next), and every row is rewritten from the newest code's
declarations on each upgrade.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic.script import Script, ScriptDirectory

from turnstile.engine.errors import ConfigurationError
from turnstile.stores.tables import Flag, metadata, stored_time

# The name each migration module declares.
MARKER = "compatible_with_previous"

schema_revision = sa.Table(
    "schema_revision", metadata,
    sa.Column("revision", sa.Text, primary_key=True),
    # The revisions it follows, comma-separated ('' for the first).
    sa.Column("down_revision", sa.Text, nullable=False),
    sa.Column("compatible_with_previous", Flag, nullable=False),
    sa.Column("recorded_at", sa.Text, nullable=False),
)


class NewerSchema(ConfigurationError):
    """The database is at a revision this code does not know, and a revision
    after the newest one it knows is not marked compatible with older code."""

    error_type = "NewerSchema"


def declared(script: Script) -> bool:
    """A migration's `compatible_with_previous` (absent or not a bool: False)."""
    value = getattr(script.module, MARKER, False)
    return value is True


def _parents(script: Script) -> str:
    down = script.down_revision
    if down is None:
        return ""
    return down if isinstance(down, str) else ",".join(down)


def record(conn: sa.Connection, scripts: ScriptDirectory, at: str | None) -> None:
    """Make `schema_revision` if missing, and write the declaration of every
    revision from `at` (the database's revision) down to the first."""
    schema_revision.create(conn, checkfirst=True)
    if at is None:
        return
    written = {r.revision: (r.down_revision, bool(r.compatible_with_previous))
               for r in conn.execute(sa.select(schema_revision))}
    now = stored_time(datetime.now(UTC))
    for script in scripts.iterate_revisions(at, "base"):
        assert isinstance(script, Script)
        row = (_parents(script), declared(script))
        if written.get(script.revision) == row:
            continue
        values = {"down_revision": row[0], "compatible_with_previous": row[1],
                  "recorded_at": now}
        if script.revision in written:
            conn.execute(schema_revision.update()
                         .where(schema_revision.c.revision == script.revision).values(values))
        else:
            conn.execute(schema_revision.insert().values(revision=script.revision, **values))


@dataclass(frozen=True)
class Newer:
    """A revision after this code's newest: compatible, or not (None: no record)."""

    revision: str
    compatible: bool | None


def known_revisions(scripts: ScriptDirectory) -> frozenset[str]:
    return frozenset(s.revision for s in scripts.walk_revisions())


def newer_revisions(conn: sa.Connection, scripts: ScriptDirectory, at: str) -> list[Newer]:
    """The revisions between this code's and the database's (`at`), newest
    first, as the database's records say. Empty when the code knows `at`. A
    lineage that never reaches a revision this code knows ends in a revision
    without a record (nothing says older code may run on it)."""
    known = known_revisions(scripts)
    if at in known:
        return []
    rows: dict[str, tuple[str, bool]] = {}
    if sa.inspect(conn).has_table(schema_revision.name):
        rows = {r.revision: (r.down_revision, bool(r.compatible_with_previous))
                for r in conn.execute(sa.select(schema_revision))}
    found: list[Newer] = []
    pending, seen = [at], set()
    while pending:
        revision = pending.pop(0)
        if revision in seen or revision in known:
            continue
        seen.add(revision)
        if revision not in rows:
            found.append(Newer(revision, None))
            continue
        parents, compatible = rows[revision]
        following = [p for p in parents.split(",") if p]
        # The first revision of a lineage this code never knew: nothing says
        # this code ran on the revision before it.
        found.append(Newer(revision, compatible if following else None))
        pending.extend(following)
    return found


def refusal(at: str, head: str, blocking: Iterable[Newer]) -> str:
    """One line: why this code does not run on the database, naming the revision."""
    first = next(iter(blocking))
    why = ("is marked not compatible with older code (it changes or removes what "
           "older code uses)" if first.compatible is False else
           "has no compatibility record (a release before 0.4.0 migrated it, or its "
           "lineage is not this code's)")
    return (f"the database is at revision {at}, newer than this code knows (its newest "
            f"is {head}), and revision {first.revision} {why}: this code cannot run on "
            f"it; run a release that knows {at} (docs/operating.md, \"Rolling back\")")


def check_window(conn: sa.Connection, scripts: ScriptDirectory, at: str) -> list[Newer]:
    """The newer revisions when this code may run on a database at `at`
    (every one compatible); NewerSchema when it may not."""
    newer = newer_revisions(conn, scripts, at)
    blocking = [n for n in newer if n.compatible is not True]
    if blocking:
        head = scripts.get_current_head() or "none"
        raise NewerSchema(refusal(at, head, blocking))
    return newer


# -- releases before the window -------------------------------------------------------

STUB = '''"""Stub of revision {revision}, written by `python -m turnstile.db stubs` of a
newer release, which has its migration and ran it: this lets older code find
the database's revision known, so it starts on the newer schema. Marked
compatible with older code by that release.

Revision ID: {revision}
Revises: {parents}
"""

revision = "{revision}"
down_revision = {down}
branch_labels = None
depends_on = None
compatible_with_previous = True


def upgrade() -> None:
    raise RuntimeError("revision {revision} is a stub: the release that has it migrates "
                       "the database")


def downgrade() -> None:
    raise RuntimeError("revision {revision} is a stub")
'''


def _literal(down: str | Sequence[str] | None) -> str:
    """`down_revision` as the revision files write it (double-quoted names)."""
    if down is None:
        return "None"
    if isinstance(down, str):
        return f'"{down}"'
    return "(" + "".join(f'"{d}", ' for d in down) + ")"


def stubs_for(scripts: ScriptDirectory, theirs: Iterable[str]) -> dict[str, str]:
    """File name -> source of a stub for each revision of this code an older
    install (knowing the revisions `theirs`) lacks. NewerSchema when one of
    them is not compatible: older code may not run on it, stub or not."""
    known = set(theirs)
    out: dict[str, str] = {}
    for script in scripts.walk_revisions():
        assert isinstance(script, Script)
        if script.revision in known:
            continue
        if not declared(script):
            raise NewerSchema(f"revision {script.revision} is marked not compatible with "
                              "older code: no stub makes older code run on it")
        out[f"{script.revision}_stub.py"] = STUB.format(
            revision=script.revision, parents=_parents(script) or "-",
            down=_literal(script.down_revision))
    return out
