"""Each run's environment in the database, and the calls that ran on it.

One `dojo_run` row per run (its id is the turn's conversation id) holds the
pickled environment (pickle, not JSON: a JSON round trip of a mutated travel
or workspace environment is lossy). A tool call reads it, runs AgentDojo's
function and writes it back inside the call's `ctx.transaction()`, together
with one `dojo_call` row: the effect commits with the call's journal or not
at all, so a retried or crashed call neither loses nor repeats an effect —
and `dojo_call` counts what was applied (`call_key` twice = applied twice).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from agentdojo.functions_runtime import FunctionCall, TaskEnvironment
from turnstile import Database

metadata = sa.MetaData()

dojo_run = sa.Table(
    "dojo_run", metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("suite", sa.Text, nullable=False),
    sa.Column("environment", sa.LargeBinary, nullable=False),
    sa.Column("calls", sa.Integer, nullable=False),  # calls applied so far
)

dojo_call = sa.Table(
    "dojo_call", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Text, nullable=False, index=True),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("call_key", sa.Text, nullable=False),  # the tool call's idempotency key
    sa.Column("function", sa.Text, nullable=False),
    sa.Column("arguments", sa.Text, nullable=False),  # JSON
    sa.Column("changed", sa.Boolean, nullable=False),  # the environment changed
)

TABLES = (dojo_run, dojo_call)


def put(db: Database, run_id: str, suite: str, env: TaskEnvironment) -> None:
    with db.connect() as conn:
        conn.execute(sa.insert(dojo_run).values(run_id=run_id, suite=suite,
                                                environment=pickle.dumps(env), calls=0))


def environment(db: Database, run_id: str) -> TaskEnvironment:
    with db.connect() as conn:
        blob = conn.execute(sa.select(dojo_run.c.environment)
                            .where(dojo_run.c.run_id == run_id)).scalar_one()
    env: TaskEnvironment = pickle.loads(blob)
    return env


@dataclass(frozen=True)
class Applied:
    """A call that ran on the environment."""

    call_key: str
    function: str
    arguments: dict[str, Any]
    changed: bool


def applied(db: Database, run_id: str) -> list[Applied]:
    with db.connect() as conn:
        rows = conn.execute(sa.select(dojo_call).where(dojo_call.c.run_id == run_id)
                            .order_by(dojo_call.c.seq, dojo_call.c.id)).mappings().all()
    return [Applied(r["call_key"], r["function"], json.loads(r["arguments"]), r["changed"])
            for r in rows]


def traces(calls: list[Applied]) -> list[FunctionCall]:
    """The calls that ran, as AgentDojo's checks read a model's calls."""
    return [FunctionCall(function=c.function, args=c.arguments) for c in calls]


def apply(conn: Any, run_id: str, call_key: str, function: str, arguments: dict[str, Any],
          run: Any) -> Any:
    """Run `run(env)` on the run's environment inside `conn`'s transaction;
    store the environment if it changed and log the call. Returns run's value."""
    row = conn.execute(sa.select(dojo_run.c.environment, dojo_run.c.calls)
                       .where(dojo_run.c.run_id == run_id)).one()
    env = pickle.loads(row.environment)
    value = run(env)
    # Changed as AgentDojo's checks compare environments (pickles of equal
    # environments may differ in bytes).
    changed = env != pickle.loads(row.environment)
    conn.execute(sa.update(dojo_run).where(dojo_run.c.run_id == run_id).values(
        calls=row.calls + 1, **({"environment": pickle.dumps(env)} if changed else {})))
    conn.execute(sa.insert(dojo_call).values(
        run_id=run_id, seq=row.calls, call_key=call_key, function=function,
        arguments=json.dumps(arguments, default=str, sort_keys=True), changed=changed))
    return value
