"""The stores' table declarations: the shared `metadata` every store adds
its `Table` to, and the column forms and stored times they share."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

# Every table of the stores. Owners add theirs at import time
# (`sa.Table("name", metadata, ...)`); nothing here imports an owner.
metadata = sa.MetaData()

# A yes/no column as v0.1 made it: BOOLEAN on PostgreSQL, INTEGER 0/1 on SQLite.
Flag = sa.Integer().with_variant(sa.Boolean(), "postgresql")
FLAG_FALSE = sa.false()  # its server default: FALSE / 0



def text_columns(*names: str, nullable: bool = False) -> list[sa.Column[str]]:
    """Plain TEXT columns (NOT NULL unless `nullable`), in the order named."""
    return [sa.Column(name, sa.Text, nullable=nullable) for name in names]


def stored_time(moment: datetime) -> str:
    """`moment` as the stores write times: ISO-8601 UTC text of one width
    (milliseconds), so that text order is time order."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class TimeWindow:
    """From `since` (included) until `until` (excluded); None: open."""

    since: datetime | None = None
    until: datetime | None = None

    def on(self, column: sa.ColumnElement[str]) -> list[sa.ColumnElement[bool]]:
        """The window as conditions on a column of stored times."""
        out = [] if self.since is None else [column >= stored_time(self.since)]
        return out if self.until is None else [*out, column < stored_time(self.until)]

