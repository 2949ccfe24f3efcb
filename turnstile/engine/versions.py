"""Versions of the turn's command sequence (what `AgentTurn` asks Temporal to
do, in order). A worker replays a turn's history with its own workflow code,
so a turn started by one version can only be continued by code that issues
the same commands.

- Version 1 (v0.1.0 and the v0.2 work before the lean turn): opens with the
  activities `turnstile.describe_service` and `turnstile.load_memory`.
- Version 2 (the lean turn): opens with the local activity
  `turnstile.begin_turn`; bookkeeping runs as local activities.

Bump `TURN_VERSION` (and add its opening here) for every change of the
command sequence, and for every change of a default of the models recorded
in history (tests/test_versions.py pins them). With Worker Versioning
(turnstile.runtime.versioning) a turn is pinned to the build that started
it, so no worker replays another build's history; without it (and for the
unversioned turns of releases before 0.3) a worker refuses to start while
turns of an older version run (turnstile.runtime.upgrade).

A *revision* of a version changes commands without breaking the turns in
flight: `begin_turn` records the revision of the worker that began the turn
(`BeginTurnResult.revision`; a history recorded before revisions existed reads
as 0), and the workflow takes the newer path only for turns begun at that
revision or later, so a turn begun earlier replays along the path it took
(what `workflow.patched` does, without a marker and a search-attribute
upsert in every turn's history). A worker older than a revision cannot run
turns begun at it (its replay meets commands it does not issue); pinning
keeps them apart, and an unversioned deployment must replace every worker at
once. Revisions remain for what pinning cannot cover: the unversioned turns
a 0.2 worker leaves running move to the 0.3 build and finish along their
revision.

- Revision 1: turn events ride with bookkeeping, "turn
  started" with `retrieve` and "turn completed" with `release_conversation`
  (`publish_event` runs only when nothing carries an event).
- Revision 2: `begin_turn` runs steps 4 and 5 once it
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
- Revision 3: the turn publishes its search attributes
  (`TurnstileStatus`, `TurnstileConversation`, `TurnstileUser`,
  `TurnstileService`) once `begin_turn` has returned, so a running turn is
  found by conversation, user or service from its start (one upsert event
  more per turn); earlier revisions publish at approval waits and the end.
- Revision 4: the turn decides who may decide by today's identity rule
  alone (turnstile.engine.identity: the skeleton in every case; a name that
  is no identity, such as one holding a lone surrogate, decides nothing) and
  asks no patch for it. A turn begun earlier weighs the earlier rules as it
  did and, where today's disagrees with them, asks `NAMES_CASE_BLIND`, so a
  decision it took replays as taken and a new one is taken by today's rule.
- Revision 5: the repeat breaker compares calls by meaning
  (turnstile.engine.equivalence): a guarded call is validated by
  `review_call` before it runs when it needs approval, when its tool already
  completed a call in the turn, or when its response holds another call of the
  tool; the key that activity returns (and the one `execute_tool` returns for
  the arguments it ran) is what the breaker compares, and a reviewer is shown
  the conversation's earlier effects that look alike (`similar_effects`).
  Earlier revisions compare raw JSON and replay so.
- Revision 6: dead ends end the turn (turnstile.engine.dead_ends): a call
  that cannot run (no arguments for a tool that requires them, a tool the
  breaker disabled, an unknown tool, a call written as text that does not
  parse, such as a bare `functions.NAME:`) is a dead end; a call without
  arguments is settled without validating it; after `DEAD_END_AFTER`
  responses in a row that are only dead ends the model is asked once for
  its answer without tools, and a dead end then ends the turn `failed` with
  `DeadEndCalls`. A disabled tool is no longer offered. A bare
  `functions.NAME:` is no call (earlier revisions read it as one with `{}`
  for `ToolCallAsText`, and replay so).
- Revision 7: information-flow rules (turnstile.engine.flow;
  docs/information-flow.md): every call of a tool with sensitive arguments
  (`ToolSpec.sensitive`, declared or an effectful tool's defaults) is
  validated by `review_call`, which derives its arguments' provenance and
  answers the rule that applies (`ReviewedCall.flow`): `refuse` settles the
  call without running it (audit `FLOW_REFUSED`), `review` makes it wait for
  a reviewer shown the provenance, `allow` runs it; the provenance rides to
  the call's audit row. Earlier revisions never ask, and replay so.
- Revision 8: standing approvals (grants; docs/approvals.md). Before a call
  waits for a reviewer, the activity `turnstile.claim_grant` claims a grant
  that covers it (one use, once per call): covered, the call runs without
  waiting, approved by the grant (`ApprovalDecision.grant_id`, reviewer
  `grant:<id>`); otherwise the pending call carries `grant_offer` and
  `grant_candidates`. An approval carrying `grant` runs
  `turnstile.issue_grant` in its handler (refused beyond the operator's
  ceiling), and the turn's other waiting calls the new grant covers are
  claimed at once. A turn begun earlier schedules neither and refuses a
  decision that carries `grant`.
- Revision 9: an answer that writes a tool result itself
  (turnstile.engine.answer_rules.fabricated_result: a `<tool_response>`,
  `<tool_result>`, `<function_results>` block, Mistral's `[TOOL_RESULTS]`,
  Llama's `ipython` header or a `Result of NAME [call ID]:` line, anywhere in
  it) is no answer: it is discarded (reason `fabricated_result`) and the
  model is asked once more without tools, `FABRICATED_NUDGE` sent after the
  stored conversation (one `call_model` more); a made-up result again ends
  the turn `failed` with `FabricatedToolResult` (once per turn, like the
  empty-answer re-ask). A turn begun earlier completes with such an answer,
  and replays so.
- Revision 10: reads that tell the model nothing new
  (turnstile.engine.repeats.same_read): a call of a tool the repeat breaker
  lets run again (`repeatable`) that completes with the same arguments and
  the same result as an earlier call of the turn is a same read; when the
  same call has come back the same `ANSWER_AFTER` times, its tool is
  withheld for the rest of the turn (not offered; a call of it not run,
  `WITHHELD_TEXT`, and a dead end), so the model goes on with the tools
  left or answers — not the round-trip cap after the same query five
  times. A turn begun earlier runs its reads to the cap, and replays so.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnstile.engine.activity_io import BEGIN_TURN, DESCRIBE_SERVICE

TURN_VERSION = 2
TURN_REVISION = 10
EVENTS_RIDE_ALONG = 1  # the revision from which turn events ride with bookkeeping
OPENS_IN_BEGIN_TURN = 2  # the revision from which begin_turn runs steps 4 and 5
CANCEL_ENDS_CANCELLED = 2  # ... and a cancel during an activity ends the turn Canceled
FINDABLE_AT_START = 3  # the revision from which a turn publishes its search attributes at once
NAMES_BY_TODAYS_RULE = 4  # the revision from which decisions weigh only today's identity rule
REPEATS_BY_MEANING = 5  # the revision from which the repeat breaker compares validated calls
DEAD_ENDS_END_TURN = 6  # the revision from which dead-end calls end the turn (DeadEndCalls)
FLOW_RULES_CHECKED = 7  # the revision from which sensitive arguments' provenance is checked
STANDING_APPROVALS = 8  # the revision from which grants cover calls (claim_grant, issue_grant)
FABRICATED_RESULTS_REASKED = 9  # ... from which an answer writing a tool result is no answer
SAME_READS_ANSWER = 10  # ... from which a read that keeps answering the same is withheld


@dataclass(frozen=True)
class Revision:
    """The revision a turn began at (`BeginTurnResult.revision`), and what it
    takes: the one place the workflow asks which path a turn follows."""

    number: int = 0  # 0: begun before revisions, or not begun yet

    @property
    def events_ride_along(self) -> bool:
        return self.number >= EVENTS_RIDE_ALONG

    @property
    def opens_in_begin_turn(self) -> bool:
        return self.number >= OPENS_IN_BEGIN_TURN

    @property
    def cancel_ends_cancelled(self) -> bool:
        return self.number >= CANCEL_ENDS_CANCELLED

    @property
    def findable_at_start(self) -> bool:
        return self.number >= FINDABLE_AT_START

    @property
    def names_by_todays_rule(self) -> bool:
        return self.number >= NAMES_BY_TODAYS_RULE

    @property
    def repeats_by_meaning(self) -> bool:
        return self.number >= REPEATS_BY_MEANING

    @property
    def dead_ends_end_turn(self) -> bool:
        return self.number >= DEAD_ENDS_END_TURN

    @property
    def flow_rules_checked(self) -> bool:
        return self.number >= FLOW_RULES_CHECKED

    @property
    def standing_approvals(self) -> bool:
        return self.number >= STANDING_APPROVALS

    @property
    def fabricated_results_reasked(self) -> bool:
        return self.number >= FABRICATED_RESULTS_REASKED

    @property
    def same_reads_answer(self) -> bool:
        return self.number >= SAME_READS_ANSWER


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

# Names compared by RFC 8265 and UTS #39's confusable skeleton
# (turnstile.engine.identity_lowercased) rather than by v0.3's NFKC key. Asked
# only when the two rules disagree about a decision (e.g. a Cyrillic "а").
NAMES_BY_STANDARD = "names-by-standard"

# Names compared case-blind and script-aware, and only names that are
# identities decide (turnstile.engine.identity, revision 4): `ТОМ` (Cyrillic
# capitals) is `tom`, `b\ud800ob` decides nothing. In turns begun before
# revision 4, asked only when this rule and the earlier ones disagree about a
# decision (from revision 4 it is the only rule, and nothing is asked).
NAMES_CASE_BLIND = "names-case-blind"

# A decision that arrives in the same activation as its approval deadline
# stands (the deadline used to overwrite it). Asked only in that case.
DECISION_BEATS_DEADLINE = "decision-beats-deadline"

# An exception no part of the turn handles ends it `failed` with
# `UnexpectedError` (workflows/agent_turn.py) instead of failing its workflow
# task (retried forever) or, for the types in FAILS_THE_TURN, its workflow
# without the ending (no release, no saga). Asked only when such an exception
# arrives, so a turn that never meets one carries no marker, and a turn that
# failed its workflow this way before replays along the path it took.
UNEXPECTED_ENDS_TURN = "unexpected-ends-turn"

# A cancelled turn publishes its ending (`TurnstileStatus=cancelled`,
# `TurnstilePendingApprovals=0`) like every other ending; earlier turns
# cancelled while they waited for an approval kept `awaiting_approval` and
# their count. Asked only on the cancel path.
CANCEL_PUBLISHED = "cancel-published"

# Every decision payload is read by the product (turnstile.engine.decision_payloads):
# one the SDK used to drop (a number as tool_call_id, no reviewer, not JSON, an
# unknown signal name) is refused and recorded. Asked only for such a payload.
DECISIONS_READ_BY_PRODUCT = "decisions-read-by-product"

# A refused decision is audited at once by its handler (one local activity),
# not when the round or the turn ends. Asked only when a decision is refused.
REFUSALS_AUDITED_AT_ONCE = "refusals-audited-at-once"

# A turn that finds its conversation busy at begin_turn says so at once: its
# step is `queued` (status query, TurnstileStatus), with whom it waits behind
# (docs/steering.md). Asked only on that path, so a turn that is not queued
# carries no marker, and one queued before replays along the path it took.
QUEUED_VISIBLE = "queued-visible"

# The repeat breaker (turnstile.engine.repeats): a call of a tool not declared
# repeatable, with the same arguments as a call of the turn that completed, is
# not run and not sent to a reviewer; its result (outcome `repeated`) says what
# the earlier call returned. Asked only when the breaker stops a call, so a turn
# that repeats nothing carries no marker, and a turn begun before it replays
# the repeated call it ran. Its BreakerPolicy and ToolSpec fields leave the
# serialized forms (and tests/data/recorded_defaults.json) as they were.
REPEAT_BREAKER = "repeat-breaker"

# An empty final answer (no text, no tool calls) is asked for once more, without
# tools, with a nudge sent after the stored conversation (the empty answer is
# discarded); still empty, the turn ends `failed` with `EmptyAnswer`
# (turnstile.engine.answer_rules). Asked only when an answer is empty: earlier
# turns completed with it, and replay so.
EMPTY_ANSWER_REASKED = "empty-answer-reasked"

# A final answer that is a call of an offered tool written as text (a JSON block
# naming it) ends the turn `failed` with `ToolCallAsText`; nothing is run.
# Asked only for such an answer: earlier turns completed with the text.
TOOL_CALL_AS_TEXT = "tool-call-as-text"

# Approval by condition (`@tool(approval=...)`, docs/approvals.md) takes no
# revision and no patch: the workflow asks `turnstile.review_call` for a call
# only when its tool's recorded spec has `approval_condition` (left out of the
# serialized spec when false), which no spec recorded before 0.5 has, so a turn
# begun earlier schedules exactly what it did. Edited approvals keep the
# tool's result (the edit rides in the result message's attributes, written
# by the execute_tool activity): workflow code never reads a result's text,
# so that change needs none either.
