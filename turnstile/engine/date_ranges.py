"""The dates a request names, worked out for the model (small local
models cannot work out "last week"). Pure: the workflow calls it with the
date of `workflow.now()` (docs/pipeline.md, step 3's built-in variables).

Every range is two ISO dates, both inclusive, in the workflow clock's UTC:

- `yesterday`: the day before today (one day: start = end);
- `this_week`: Monday of today's ISO week to today;
- `last_week`: Monday to Sunday of the ISO week before today's (never the 7
  days before today);
- `this_month`: the 1st of today's month to today;
- `last_month`: the 1st to the last day of the month before today's;
- `last_N_days` (`last_days(today, n)`; 7 and 30 are built in): the N days
  ending today, today included (today - (N - 1) to today).
"""

from __future__ import annotations

from datetime import date, timedelta

DateRange = tuple[date, date]
BUILT_IN_DAYS = (7, 30)


def last_days(today: date, n: int) -> DateRange:
    """The `n` days ending today, today included."""
    if n < 1:
        raise ValueError(f"last N days needs N >= 1, got {n}")
    return today - timedelta(days=n - 1), today


def date_ranges(today: date) -> dict[str, DateRange]:
    """The named ranges for `today`, in the order the prompt lists them."""
    monday = today - timedelta(days=today.weekday())
    first = today.replace(day=1)
    last_month_end = first - timedelta(days=1)
    yesterday = today - timedelta(days=1)
    ranges: dict[str, DateRange] = {
        "yesterday": (yesterday, yesterday),
        "this_week": (monday, today),
        "last_week": (monday - timedelta(days=7), monday - timedelta(days=1)),
        "this_month": (first, today),
        "last_month": (last_month_end.replace(day=1), last_month_end),
    }
    for n in BUILT_IN_DAYS:
        ranges[f"last_{n}_days"] = last_days(today, n)
    return ranges


def _span(r: DateRange) -> str:
    return r[0].isoformat() if r[0] == r[1] else f"{r[0].isoformat()} to {r[1].isoformat()}"


def date_variables(today: date) -> dict[str, str]:
    """Template variables: `{{yesterday}}`, `{{last_week}}` ("2026-11-23 to
    2026-11-29"), ... one per range, `{{<name>_start}}` and `{{<name>_end}}`,
    and `{{date_ranges}}`: all of them, one line each."""
    ranges = date_ranges(today)
    out: dict[str, str] = {}
    for name, r in ranges.items():
        out[name] = _span(r)
        out[f"{name}_start"], out[f"{name}_end"] = r[0].isoformat(), r[1].isoformat()
    out["date_ranges"] = "\n".join(
        f"- {name.replace('_', ' ')}: {_span(r)}" for name, r in ranges.items())
    return out
