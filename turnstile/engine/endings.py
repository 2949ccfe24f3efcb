"""How a model response ended, and what the turn does about it (pure).

`finish_reason` is the provider's word on why the answer stopped. Only a
natural stop is a complete answer:

- `length`: cut at the output-token limit. The turn asks once to continue
  (a continuation request), then ends `truncated` with what it received;
- `content_filter`: the provider's filter withheld the answer: `moderated`;
- anything else (`stop`, `tool_calls`, a server's own word, or none at all)
  is taken as the server reports it.
"""

from __future__ import annotations

from enum import StrEnum

CONTINUATION_PROMPT = (
    "Your previous answer was cut off by the output length limit. Continue it exactly "
    "where it stopped, without repeating anything already written."
)
TRUNCATED_MESSAGE = (
    "the model's answer was cut off by its output length limit, twice (after one "
    "continuation request); the answer holds what was received"
)
FILTERED_MESSAGE = "the model provider's content filter withheld the answer"


class AnswerEnding(StrEnum):
    """How a model answer ended (the call journal's `Ending` is how a tool call did)."""

    COMPLETE = "complete"
    LENGTH = "length"
    FILTERED = "content_filter"


def ending(finish_reason: str | None) -> AnswerEnding:
    if finish_reason == "length":
        return AnswerEnding.LENGTH
    if finish_reason == "content_filter":
        return AnswerEnding.FILTERED
    return AnswerEnding.COMPLETE
