"""The key of one tool call of one turn: workflow id, execution chain (Temporal's
first_execution_run_id: a new start of a closed workflow id is a new chain, so
provider call ids that repeat, call_0..., never collide) and the call id.

`tool_call_ledger` and `approval_decision` are keyed by its three columns;
`tool_execution_log` by its text form, `execution_id`."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa


def execution_id(workflow_id: str, call_id: str, chain: str = "") -> str:
    """One execution of one tool call: the call id scoped to its turn's
    execution chain (provider call ids repeat across turns and runs)."""
    return f"{workflow_id}/{chain}/{call_id}" if chain else f"{workflow_id}/{call_id}"


def key_columns() -> list[sa.Column[str]]:
    """The primary key of a table with one row per call."""
    return [sa.Column("workflow_id", sa.Text, primary_key=True),
            sa.Column("execution_chain", sa.Text, primary_key=True, server_default=""),
            sa.Column("tool_call_id", sa.Text, primary_key=True)]


@dataclass(frozen=True)
class CallKey:
    workflow_id: str
    chain: str
    call_id: str

    @property
    def execution_id(self) -> str:
        return execution_id(self.workflow_id, self.call_id, self.chain)

    def of(self, table: sa.Table) -> sa.ColumnElement[bool]:
        """The row of this call in `table` (keyed by `key_columns`)."""
        return sa.and_(table.c.workflow_id == self.workflow_id,
                       table.c.execution_chain == self.chain,
                       table.c.tool_call_id == self.call_id)
