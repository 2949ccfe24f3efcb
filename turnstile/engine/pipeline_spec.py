"""The pipeline's policies as data (docs/pipeline.md).

`PipelinePolicy` is what a service author sets; `PipelineSpec` is what the
worker derives from the service (which components exist, the output schema,
whether the provider takes `response_format`) and hands to the workflow via
`begin_turn`, so every decision a turn makes is recorded in its history.
The callables themselves (retriever, guardrails, transformer, moderator) stay
in the worker's `Service` and run in activities.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

DEFAULT_RETRIEVAL_TEMPLATE = (
    "{{message}}\n\nAnswer using the following information where it is relevant:\n"
    "{{contents}}"
)
DEFAULT_MODERATION_MESSAGE = (
    "Your message was flagged by moderation ({categories}) and was not answered."
)

Outcome = Literal["pass", "fail", "fatal", "retry", "reprompt"]


class PipelinePolicy(BaseModel):
    """Knobs of the optional steps; every default keeps a step's documented
    default behaviour (docs/pipeline.md)."""

    # 5. retrieval
    retrieval_top_k: int = 3
    retrieval_max_chars: int = 2000  # of retrieved text per turn (it is in history)
    retrieval_template: str = DEFAULT_RETRIEVAL_TEMPLATE  # {{message}}, {{contents}}
    # "augmented": memory keeps the message the model saw (raw text in the
    # `turnstile.raw_user_message` attribute); "original": memory keeps the
    # message without the retrieved text, which only this turn's model calls see.
    retrieval_memory: Literal["augmented", "original"] = "augmented"
    # 6. multimodal: inline base64 travels in the workflow input and in one
    # memory write, so it is capped; pass large images by https URL.
    max_inline_attachment_chars: int = 512 * 1024
    max_attachments: int = 8
    # 8. streaming: partial text goes to the `turn_stream` table, not history
    streaming: bool = False
    # 9/16. typed output
    output_format: Literal["auto", "json_schema", "instructions"] = "auto"
    max_parse_retries: int = 2  # re-asks after a parse failure, then OutputParseError
    # 11. moderation
    moderation_on_error: Literal["fail", "allow"] = "fail"  # moderator unavailable
    moderation_message: str = DEFAULT_MODERATION_MESSAGE  # {categories}
    # 15. output guardrails: retry/reprompt re-asks per turn
    max_output_guardrail_reasks: int = 2
    # 4/17. typed events to the worker's listeners (logging, OpenTelemetry)
    events: bool = True


class OutputSpec(BaseModel):
    """Step 9: the return type as JSON schema and how it reaches the model."""

    type_name: str
    json_schema: dict[str, Any]
    mode: Literal["json_schema", "instructions"]

    def response_format(self) -> dict[str, Any]:
        return {"type": "json_schema",
                "json_schema": {"name": self.type_name, "schema": self.json_schema}}


class PipelineSpec(BaseModel):
    policy: PipelinePolicy = Field(default_factory=PipelinePolicy)
    system_transformer: str | None = None  # name of the step-2 transformer
    retriever: str | None = None  # name of the step-5 retriever
    input_guardrails: list[str] = Field(default_factory=list)
    output: OutputSpec | None = None
    moderator: str | None = None
    output_guardrails: list[str] = Field(default_factory=list)


class GuardrailVerdict(BaseModel):
    """What a chain of guardrails decided (steps 7 and 15)."""

    outcome: Outcome = "pass"
    guardrail: str = ""  # which guardrail decided (the first fatal, else the first non-pass)
    message: str = ""  # for the user (fail/fatal) or the record (retry)
    guidance: str = ""  # reprompt: the user message appended for the model
    failures: list[str] = Field(default_factory=list)  # "name: message" of every failing one
