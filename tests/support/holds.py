"""Named points where a test's subprocess (a worker, a command) stops and
waits, so the test can SIGKILL it exactly there.

The process is told by its environment: TEST_HOLD_POINT names the point,
TEST_HOLD_FILE a file. When the process reaches that point while the file
exists, it writes FILE + ".entered" and waits until the file is removed (two
minutes at most). The points are:

- `held("NAME")` called by test code (e.g. a tool's approval condition);
- `after INSERT INTO table` / `after DELETE FROM table` (the first three
  words of a statement): right after such a statement ran, its transaction
  still open (`install()` hooks every SQLAlchemy engine of the process);
- `review_call in look_alikes`: before a statement that the
  `turnstile.review_call` activity runs for its look-alike search (a frame
  of that name on the stack);
- `review_call in derive`: as the activity derives where a call's sensitive
  arguments came from (turnstile.engine.provenance.derive, after the
  conversation was read).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from temporalio import activity

from turnstile.engine.activity_io import REVIEW_CALL

POINT, FILE = "TEST_HOLD_POINT", "TEST_HOLD_FILE"
PREFIX = "review_call in "


def env(point: str, file: Path) -> dict[str, str]:
    """The environment that makes a subprocess hold at `point` while `file` exists."""
    return {POINT: point, FILE: str(file)}


def held(point: str) -> None:
    """Wait here while this process is told to hold at `point`."""
    file = os.environ.get(FILE)
    if os.environ.get(POINT) != point or not file or not Path(file).exists():
        return
    Path(file + ".entered").touch()
    deadline = time.monotonic() + 120
    while Path(file).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _function_on_stack(name: str) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == name:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
    point = os.environ.get(POINT, "")
    if point.startswith(PREFIX) and activity.in_activity() \
            and activity.info().activity_type == REVIEW_CALL \
            and _function_on_stack(point[len(PREFIX):]):
        held(point)


def _after(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
    words = " ".join(statement.split()[:3])
    held(f"after {words}")


def install() -> None:
    """Hook every engine of this process, and review_call's derivation (when
    a hold is asked for)."""
    if not os.environ.get(POINT) or sa.event.contains(sa.engine.Engine,
                                                      "before_cursor_execute", _before):
        return
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", _before)
    sa.event.listen(sa.engine.Engine, "after_cursor_execute", _after)
    from turnstile.activities import review

    derive = review.derive

    def held_derive(*args: Any, **kwargs: Any) -> Any:
        held(PREFIX + "derive")
        return derive(*args, **kwargs)

    review.derive = held_derive  # type: ignore[assignment]


if __name__ == "__main__":
    # `python -m tests.support.holds ARGV...`: `python starter.py ARGV...` with the hooks.
    install()
    from turnstile.cli import starter

    starter.run_main(sys.argv[1:])
