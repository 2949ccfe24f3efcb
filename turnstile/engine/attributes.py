"""Names of attributes carried on stored messages.

These travel with tool-result messages in `chat_message.attributes` and are
read back by later turns and other programs: they are a compatibility contract.
Add new names; never rename or reuse one.
"""

TOOL_NAME = "turnstile.tool_name"  # tool messages: which tool produced the result
WORKFLOW_ID = "turnstile.workflow_id"  # which turn wrote the message
OUTCOME = "turnstile.outcome"  # tool messages: a CallStatus value (completed, failed, ...)
ROLLED_BACK = "turnstile.rolled_back"  # true once a compensation undid the call
ROLLBACK_CAUSE = "turnstile.rollback_cause"  # RollbackCause: {type, message, call_id}
EFFECT_MAY_REMAIN = "turnstile.effect_may_remain"  # compensation failed
RAW_USER_MESSAGE = "turnstile.raw_user_message"  # user messages changed by retrieval
STATE = "turnstile.state"  # tool-provided cross-round state (dict)
AUGMENTED_USER_MESSAGE = "turnstile.augmented_user_message"  # retrieval, memory "original"
RETRIEVED_SOURCES = "turnstile.retrieved_sources"  # [{doc_id, title}] behind a user message
DISCARDED = "turnstile.discarded"  # an answer the output guardrails threw away: never resent
REPROMPT = "turnstile.reprompt"  # user messages the pipeline wrote: why (guardrail, parse)
# A result written by the next turn's memory load for a call whose turn ended
# without one (terminate, reset, a lost run): {by, reason, source}
REPAIRED = "turnstile.repaired"
# On a message a reset run superseded (kept in `superseded_message`), for each
# tool call of the replaced run once its turn's run ends: what became of the
# call's effect, {by, effect, ledger, detail}; `effect` is "made_again" (the
# reset run made the same call and its result is in memory), "remains" (the
# call took effect and the reset run did not make it again), "unknown" (it
# was running when its run was replaced) or "none" (it never took effect).
SUPERSEDED_EFFECT = "turnstile.superseded_effect"
# On the result of a call the repeat breaker did not run (outcome `repeated`):
# the id of the earlier call of the turn, same tool and arguments, that ran.
REPEAT_OF = "turnstile.repeat_of"
# On the result of a call a reviewer approved with edits (beside the tool's own
# result, which stays as the tool returned it): {by, model_arguments,
# arguments, changed} (turnstile.engine.approvals.recorded_edits).
EDITED = "turnstile.edited"
