"""What each model call cost: one row per call in `model_usage` (migration 0008).

The model-call activity (activities/model.py) records a row when the model
has answered, in the transaction that stores the answer: the model's name as
it reported it (else the worker's), and the prompt and completion tokens of
its `usage`. The row is keyed by the call — workflow id, run id and the memory
slot the answer takes (`usage_key`, `<workflow id>/<run id>/<slot>`) — and
inserted with ON CONFLICT DO NOTHING, so a retried attempt of the activity
never counts a call twice; a reset run of the turn (a new run id) asks the
model again, and that call is counted as spent.

Read by `starter.py usage` (`summary`: sums per user, service and model) and
by the per-user daily token budget (`tokens_since`, TURNSTILE_DAILY_TOKEN_BUDGET),
through the indexes `model_usage_person_time (person, recorded_at)`,
`model_usage_person_upper_time` and `model_usage_person_written_time`.

A user is a person, not a spelling: each row carries the user id's three
person keys (turnstile.engine.identity.person_keys: `person`, in lower case,
migration 0009; `person_upper` and `person_written`, in capitals and as
written, migration 0011), and the budget and `--user` count every row one of
whose keys is one of the user's — `Alice`, `alice`, `аlice` and `ТОМ`'s
`tom` spend one budget. Rows a previous release's worker wrote have no
`person_written`; they count by their `user_id`, read through the same rule.

`recorded_at` is ISO-8601 UTC text of one width, as every time the stores
write (turnstile.stores.memory.now_iso), so a window is a text range.

This module is the one writer of `model_usage`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import sqlalchemy as sa

from turnstile.engine.identity import person_keys, same_person
from turnstile.stores.connection import Connection
from turnstile.stores.db import Database
from turnstile.stores.memory import now_iso
from turnstile.stores.tables import (
    TimeWindow,
    metadata,
    stored_time as stored_time,  # `recorded_at`'s form
    text_columns,
)

model_usage = sa.Table(
    "model_usage", metadata,
    sa.Column("usage_key", sa.Text, primary_key=True),  # usage_key(workflow, run, slot)
    sa.Column("workflow_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("call_seq", sa.BigInteger, nullable=False),  # the answer's memory slot
    *text_columns("conversation_id", "user_id", "service", "model"),
    # person_keys(user_id): lower, upper, written (NULL on rows a previous
    # release's worker wrote: person_written always, person before 0009).
    sa.Column("person", sa.Text),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Column("recorded_at", sa.Text, nullable=False),
    sa.Column("person_upper", sa.Text),
    sa.Column("person_written", sa.Text),
    # A user's tokens in a window (the budget, `starter.py usage --user`).
    sa.Index("model_usage_user_time", "user_id", "recorded_at"),
    # A person's tokens in a window (the budget, `starter.py usage --user`).
    sa.Index("model_usage_person_time", "person", "recorded_at"),
    sa.Index("model_usage_person_upper_time", "person_upper", "recorded_at"),
    sa.Index("model_usage_person_written_time", "person_written", "recorded_at"),
)
c = model_usage.c


def usage_key(workflow_id: str, run_id: str, call_seq: int) -> str:
    """One model call of one run of a turn (run ids hold no "/")."""
    return f"{workflow_id}/{run_id}/{call_seq}"


@dataclass(frozen=True)
class ModelCall:
    """One model call as it is accounted: who, where, which model, how much."""

    workflow_id: str
    run_id: str
    call_seq: int
    conversation_id: str
    user_id: str
    service: str
    model: str
    prompt_tokens: int
    completion_tokens: int


def record(conn: Connection, call: ModelCall, recorded_at: str | None = None) -> bool:
    """Record `call` in the caller's transaction; False when it was recorded
    already (an earlier attempt of the same activity)."""
    keys = person_keys(call.user_id)
    values: dict[str, Any] = {
        "usage_key": usage_key(call.workflow_id, call.run_id, call.call_seq),
        "workflow_id": call.workflow_id, "run_id": call.run_id, "call_seq": call.call_seq,
        "conversation_id": call.conversation_id, "user_id": call.user_id,
        "person": keys.lower, "person_upper": keys.upper, "person_written": keys.written,
        "service": call.service, "model": call.model,
        "prompt_tokens": max(0, int(call.prompt_tokens)),
        "completion_tokens": max(0, int(call.completion_tokens)),
        "recorded_at": recorded_at or now_iso(),
    }
    return conn.insert_new(model_usage, values)


def utc_midnight(now: datetime | None = None) -> datetime:
    """The start of the UTC day of `now` (the budget's day)."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def tokens_since(conn: Connection, user_id: str, since: datetime) -> int:
    """Prompt plus completion tokens of the model calls of the person
    `user_id` names (every spelling of them) from `since` on."""
    spent = c.prompt_tokens + c.completion_tokens
    total = sa.func.coalesce(sa.func.sum(spent), 0)
    window = c.recorded_at >= stored_time(since)
    stmt = sa.select(total.label("tokens")).where(person_of(user_id), window)
    tokens = conn.scalar(stmt, int) or 0
    return tokens + sum(n for user, n in _unkeyed(conn, window) if same_person(user, user_id))


def person_of(user_id: str) -> sa.ColumnElement[bool]:
    """The keyed rows of the person `user_id` names: one of the row's keys
    is one of the user's (the relation of identity.same_person)."""
    keys = sorted(set(person_keys(user_id)))
    return sa.and_(c.person_written.is_not(None),
                   sa.or_(c.person.in_(keys), c.person_upper.in_(keys),
                          c.person_written.in_(keys)))


def _unkeyed(conn: Connection, *where: sa.ColumnElement[bool]) -> list[tuple[str, int]]:
    """(user id, tokens) of the rows without person keys (a previous
    release's worker wrote them): few, and read by the identity rule here."""
    tokens = sa.func.sum(c.prompt_tokens + c.completion_tokens).label("tokens")
    stmt = (sa.select(c.user_id, tokens).where(c.person_written.is_(None), *where)
            .group_by(c.user_id))
    return conn.rows(stmt, lambda user_id, tokens: (str(user_id), int(tokens or 0)))


@dataclass(frozen=True)
class UsageFilter(TimeWindow):
    """Which model calls `summary` sums: a time window, a user, a service."""

    user: str | None = None
    service: str | None = None

    def where(self) -> list[sa.ColumnElement[bool]]:
        found = self.on(c.recorded_at) + ([c.service == self.service] if self.service else [])
        if self.user:  # the person, every spelling (rows without one: by user id)
            found.append(sa.or_(person_of(self.user),
                                sa.and_(c.person_written.is_(None), c.user_id == self.user)))
        return found


class UsageTotal(NamedTuple):
    """One line of `summary`."""

    user_id: str
    service: str
    model: str
    turns: int
    model_calls: int
    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def of(cls, user_id: str, service: str, model: str, turns: Any, model_calls: Any,
           prompt_tokens: Any, completion_tokens: Any) -> UsageTotal:
        """A row as the engine returns it: SUM is NUMERIC or BIGINT by engine."""
        return cls(user_id, service, model, int(turns or 0), int(model_calls or 0),
                   int(prompt_tokens or 0), int(completion_tokens or 0))


SUMMARY_COLUMNS = UsageTotal._fields


def summary(db: Database, f: UsageFilter) -> list[UsageTotal]:
    """Per (user, service, model) matching `f`: turns (distinct workflow
    ids), model calls, prompt and completion tokens; most tokens first."""
    prompt = sa.func.sum(c.prompt_tokens)
    completion = sa.func.sum(c.completion_tokens)
    stmt = (sa.select(c.user_id, c.service, c.model,
                      sa.func.count(sa.distinct(c.workflow_id)).label("turns"),
                      sa.func.count().label("model_calls"),
                      prompt.label("prompt_tokens"), completion.label("completion_tokens"))
            .where(*f.where())
            .group_by(c.user_id, c.service, c.model)
            .order_by((prompt + completion).desc(), c.user_id, c.service, c.model))
    with db.connect() as conn:
        return conn.rows(stmt, UsageTotal.of)
