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

A *revision* of a version changes commands without breaking the turns in
flight: `begin_turn` records the revision of the worker that began the turn
(`BeginTurnResult.revision`; a history recorded before revisions existed reads
as 0), and the workflow takes the newer path only for turns begun at that
revision or later, so a turn begun earlier replays along the path it took
(what `workflow.patched` does, without a marker and a search-attribute
upsert in every turn's history). A worker older than a revision cannot run
turns begun at it (its replay meets commands it does not issue): upgrade every
worker before the new revision's turns reach an old one, or drain as for a
version.

- Revision 1 (2 December 2026): turn events ride with bookkeeping, "turn
  started" with `retrieve` and "turn completed" with `release_conversation`
  (`publish_event` runs only when nothing carries an event).
- Revision 2 (2 December 2026): `begin_turn` runs steps 4 and 5 once it
  holds the conversation: it delivers "turn started" and runs the retriever
  on the user message as step 3 renders it (`BeginTurnInput.opening`,
  `BeginTurnResult.opened`), so a turn schedules no `retrieve` and no
  `publish_event` of its own. Not when the conversation is busy, when a
  system transformer (step 2) runs first, or when the retriever fails or
  outlasts its budget there: then step 5 (and, unless delivered, step 4)
  runs as in revision 1. Also from revision 2, a cancel while an activity
  runs (a model call, a guardrail, begin_turn) ends the turn Canceled through
  its cancel path; earlier revisions ended it as that activity's failure.
  Cancelled during `begin_turn` itself (before the turn's revision is known),
  a turn takes the worker's path: a revision-1 turn cancelled there and
  still finishing when its worker is replaced fails its replay (retried
  until an older worker takes it, or ended by `temporal workflow terminate`;
  it had stored nothing).
- Revision 3 (3 December 2026): the turn publishes its search attributes
  (`TurnstileStatus`, `TurnstileConversation`, `TurnstileUser`,
  `TurnstileService`) once `begin_turn` has returned, so a running turn is
  found by conversation, user or service from its start (one upsert event
  more per turn); earlier revisions publish at approval waits and the end.
"""

from __future__ import annotations

from turnstile.engine.activity_io import BEGIN_TURN, DESCRIBE_SERVICE

TURN_VERSION = 2
TURN_REVISION = 3
EVENTS_RIDE_ALONG = 1  # the revision from which turn events ride with bookkeeping
OPENS_IN_BEGIN_TURN = 2  # the revision from which begin_turn runs steps 4 and 5
CANCEL_ENDS_CANCELLED = 2  # ... and a cancel during an activity ends the turn Canceled
FINDABLE_AT_START = 3  # the revision from which a turn publishes its search attributes at once

# The first activity (or local activity) each version schedules.
OPENINGS: dict[str, int] = {DESCRIBE_SERVICE: 1, BEGIN_TURN: 2}

# Patches (`workflow.patched`): a marker only in the turns that take the new path.
# The door (turnstile.engine.turn_input_rules): a turn whose input breaks a rule
# ends `refused` at once. Asked only when the input breaks one, so a valid turn's
# history carries no marker, and a turn begun earlier with such input replays
# along the path it took.
TURN_INPUT_DOOR = "turn-input-door"

# Reviewer, requester and approver names compared as identities
# (turnstile.engine.identity), not as spelled. Asked only when the two rules
# disagree about a decision, so most turns carry no marker.
NAMES_AS_IDENTITIES = "names-as-identities"

# A decision that arrives in the same activation as its approval deadline
# stands (the deadline used to overwrite it). Asked only in that case.
DECISION_BEATS_DEADLINE = "decision-beats-deadline"

# A model call refused for the user's daily token budget (BudgetExceeded,
# TURNSTILE_DAILY_TOKEN_BUDGET) ends the turn `refused`, not `failed`. Asked
# only when a model call failed with that error, so other turns carry no marker.
BUDGET_REFUSED = "budget-refused"
