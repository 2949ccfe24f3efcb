"""Identical "invalid request" 5xx answers end the model call.

Model calls retry 5xx answers for `LoopPolicy.model_retry_window_seconds`
(six hours by default): right for a server that is down, wrong for one that
answers every attempt with the same validation error (llama-cpp-python
answers a request it cannot read with a 500), which would hold the turn, and
its conversation, for the whole window.

The rule: a 5xx whose body says the request is invalid
(`turnstile.providers.openai_compat.says_invalid_request`) is retried while
the answers differ; the `MODEL_REFUSAL_LIMIT`-th identical one in a row
(same status, same body but for ids and numbers) ends the call with the
non-retryable `ModelServerRefused`, naming the server's message (masked,
at most 300 characters). Any other failure (a refused connection, a 502 or
503 without such a body, a timeout) resets the count and is retried as
before.

The count crosses attempts in the activity's heartbeat details: an attempt
that gets such an answer heartbeats `{"refusal": fingerprint, "count": n}`
before it fails (the SDK sends that heartbeat with the failure, and the next
attempt reads it in `activity.info().heartbeat_details`); the attempt's
periodic heartbeats carry the same details, so a slow attempt keeps them. An
attempt after a different failure heartbeats an empty count.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnstile.engine.errors import ModelServerRefused
from turnstile.engine.masking import mask_text
from turnstile.engine.safe_text import safe_text
from turnstile.providers.openai_compat import InvalidRequestAnswer

log = logging.getLogger(__name__)

# Identical invalid-request answers in a row that end the call: the first two
# are retried (1 s, then 2 s apart with the default retry policy), the third ends it.
MODEL_REFUSAL_LIMIT = 3
_MESSAGE_MAX = 300


def carried(details: Sequence[Any]) -> dict[str, Any]:
    """The count the previous attempt left (`{}` when none or unreadable)."""
    if details and isinstance(details[0], dict):
        fingerprint, count = details[0].get("refusal"), details[0].get("count")
        if isinstance(fingerprint, str) and isinstance(count, int) and count > 0:
            return {"refusal": fingerprint, "count": count}
    return {}


def counted(previous: dict[str, Any], fingerprint: str) -> int:
    """How many identical answers in a row this one makes."""
    return previous["count"] + 1 if previous.get("refusal") == fingerprint else 1


class RefusalCount:
    """One model-call attempt's view of the count (see the module's docstring)."""

    def __init__(self) -> None:
        self.details = carried(activity.info().heartbeat_details)

    def beat(self) -> Sequence[Any]:
        """What each periodic heartbeat of this attempt carries."""
        return (self.details,) if self.details else ()

    def refused(self, exc: InvalidRequestAnswer) -> ApplicationError:
        """The failure for an invalid-request answer: retryable below the limit,
        `ModelServerRefused` (non-retryable) at it."""
        count = counted(self.details, exc.fingerprint)
        said = mask_text(safe_text(exc.body)).strip()[:_MESSAGE_MAX]
        if count >= MODEL_REFUSAL_LIMIT:
            log.warning("model server refused the request %d times alike: %s", count, said)
            return ApplicationError(
                f"the model server answered {exc.status} to the same request {count} times "
                f"with the same error; retrying cannot help: {said}",
                type=ModelServerRefused.error_type, non_retryable=True)
        self.details = {"refusal": exc.fingerprint, "count": count}
        activity.heartbeat(self.details)  # sent with this attempt's failure
        delay = None if exc.retry_after is None else timedelta(seconds=exc.retry_after)
        return ApplicationError(
            f"the model server answered {exc.status} ({count} of {MODEL_REFUSAL_LIMIT} "
            f"alike before the turn ends): {said}", type=ModelServerRefused.error_type,
            next_retry_delay=delay)

    def other_failure(self) -> None:
        """A failure of another kind: the next invalid-request answer counts from 1."""
        if self.details:
            self.details = {}
            activity.heartbeat()

