"""Versions of the turn's command sequence (what `AgentTurn` asks Temporal to
do, in order). A worker replays a turn's history with its own workflow code,
so a turn started by one version can only be continued by code that issues
the same commands.

- Version 1 (v0.1.0 and the v0.2 work before the lean turn): opens with the
  activities `turnstile.describe_service` and `turnstile.load_memory`.
- Version 2 (the lean turn, issue 13): opens with the local activity
  `turnstile.begin_turn`; bookkeeping runs as local activities.

Bump `TURN_VERSION` (and add its opening here) for every change of the
command sequence, and for every change of a default of the models recorded
in history (tests/test_versions.py pins them): a worker refuses to start
while turns of an older version run (turnstile.runtime.upgrade), so code never
replays a history of another version.
"""

from __future__ import annotations

from turnstile.engine.activity_io import BEGIN_TURN, DESCRIBE_SERVICE

TURN_VERSION = 2

# The first activity (or local activity) each version schedules.
OPENINGS: dict[str, int] = {DESCRIBE_SERVICE: 1, BEGIN_TURN: 2}
