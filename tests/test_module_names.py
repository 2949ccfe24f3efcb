"""No file name is used twice in the package: a module is found by its name
(`tools.py` was three modules, `steering.py` three). The reference sales app
(turnstile/sales) is an app like a user's and keeps an app's own module
names (app, schema, sender, truth); the two pairs below are all that is left,
each kept for a named reason, and the list only shrinks."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "turnstile"
APP = PACKAGE / "sales"
KNOWN = {
    # `turnstile.client` is the public client; the runtime's Temporal
    # connection (runtime/client.py) is imported by the test kit too.
    "client.py": {"turnstile/client.py", "turnstile/runtime/client.py"},
    # `python -m turnstile.db` is the documented database command.
    "db.py": {"turnstile/db.py", "turnstile/stores/db.py"},
}


def _names() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py" or path.is_relative_to(APP):
            continue
        found[path.name].add(str(path.relative_to(PACKAGE.parent)))
    return found


def test_no_file_name_is_used_twice() -> None:
    twice = {name: paths for name, paths in _names().items() if len(paths) > 1}
    assert twice == KNOWN


def test_the_walk_sees_the_package() -> None:
    names = _names()
    assert names["tool_calls.py"] == {"turnstile/activities/tool_calls.py"}
    assert names["tools.py"] == {"turnstile/runtime/tools.py"}
    assert names["steering.py"] == {"turnstile/runtime/steering.py"}
