"""What a service asks of its model besides the conversation.

`ModelSettings` is a `Service(model=...)` field and a `ServiceSpec` field, so
the settings a turn ran with are recorded in its history with the other
policies (every default here is pinned by tests/test_versions.py: a history
that records none of them reads back as these defaults). The provider puts
them on the wire (turnstile/providers/openai_compat.py); the compact-prompt
options shape step 5 when the worker describes the service
(turnstile/runtime/services.py). docs/local-models.md says which settings a
small local model needs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# How tool schemas are written on the wire (turnstile/engine/schema_dialect.py):
# "full" as the tools declare them; "grammar" without what servers that compile
# schemas into grammars (llama.cpp's llama-server, llama-cpp-python) refuse.
SchemaDialect = Literal["full", "grammar"]
SCHEMA_DIALECTS: tuple[SchemaDialect, ...] = ("full", "grammar")

# tool_choice values that are not a tool's name.
TOOL_CHOICE_MODES = ("auto", "required")


class ModelSettings(BaseModel):
    """Per-service settings of the model request (docs/local-models.md)."""

    # The reply's token limit (`max_tokens`); None: the server's own.
    max_tokens: int | None = Field(default=None, gt=0)
    # Sampling temperature; None: the server's default.
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    # "auto" (the model decides), "required" (it must call a tool) or a tool's
    # name (it must call that tool). "required" and a name apply to the turn's
    # first model request only (round 0; `tool_choice_rounds` for more);
    # later requests send "auto", so the model can answer once it has what
    # it needs.
    tool_choice: str = "auto"
    # The dialect of the tool schemas sent; None: the provider's
    # (LLM_SCHEMA_DIALECT, default "grammar").
    schema_dialect: SchemaDialect | None = None
    # Compact prompt: False leaves step 5 (retrieval) out, so the user message
    # carries no documents.
    documents: bool = True
    # Compact prompt: the line that introduces retrieved documents in the user
    # message (None: PipelinePolicy.retrieval_template's, "Answer using the
    # following information where it is relevant:").
    retrieval_lead_in: str | None = None
    # Read tool calls the model wrote as text (a JSON call of an offered tool
    # in ```json, <tool_call> or <tools>, the answer being nothing else) as the
    # calls they are, for a server whose chat template does not parse this
    # model's format (Qwen2.5-Coder under llama-server, measured). Off: such an
    # answer ends the turn `ToolCallAsText` (turnstile/engine/answer_rules.py).
    text_tool_calls: bool = False
    # How tool calls and their results travel in the request: "messages" (the
    # OpenAI way: the assistant's `tool_calls`, one `role: tool` message per
    # result) or "text" (the assistant's calls written into its text, the
    # results as a user message), for a server whose chat template drops
    # `role: tool` (llama-cpp-python's chatml-function-calling, measured: the
    # model never saw a result and answered "[list of customer IDs]").
    # Memory keeps them as calls and results either way.
    tool_results: Literal["messages", "text"] = "messages"
    # Constrained tool calls (turnstile/engine/constrained_calls.py): the
    # request carries no `tools` but a `response_format` JSON schema, "one of
    # these tool calls (their arguments in the grammar dialect), or a final
    # answer", which servers that compile schemas into grammars (llama.cpp's
    # llama-server, llama-cpp-python) enforce; the tools are named in a
    # system message, and the reply is read back as calls or an answer (the
    # arguments still validated against the full schema). Not with a
    # service's output type (its schema is the response_format). Left out of
    # the serialized form when False, so recorded specs read as before.
    constrain_tool_calls: bool = Field(default=False, exclude_if=lambda v: not v)
    # False: at most one tool call per reply (`parallel_tool_calls: false` on
    # the wire; with constrain_tool_calls, `maxItems: 1` in the schema), so a
    # model reads one call's result before it writes the next call's
    # arguments. Measured: Qwen2.5-Coder-1.5B, constrained, wrote
    # querySalesData and createEmailTask in one reply, the e-mail's body a
    # template ("Dear [Customer Name]") because no result was known yet. Left
    # out of the serialized form when True, so recorded specs read as before.
    parallel_tool_calls: bool = Field(default=True, exclude_if=lambda v: v)
    # How many of the turn's first rounds `tool_choice` ("required" or a
    # name) applies to; later requests send "auto". 2 fits a turn that is
    # known to need two calls in sequence (the sales turn: the query, then the
    # e-mail): measured, Qwen2.5-Coder-1.5B under constrained calls answered
    # after the query, inventing a taskId, instead of calling createEmailTask.
    # Left out of the serialized form when 1, so recorded specs read as before.
    tool_choice_rounds: int = Field(default=1, ge=1, le=8, exclude_if=lambda v: v == 1)

    def choice_for(self, round_: int, offered: list[str]) -> str | dict[str, object]:
        """The wire's `tool_choice` for a request in `round_` offering `offered`:
        "auto" from round `tool_choice_rounds` on, and when the named tool is
        not offered."""
        choice = self.tool_choice
        if round_ >= self.tool_choice_rounds or choice == "auto":
            return "auto"
        if choice == "required":
            return "required"
        if choice in offered:
            return {"type": "function", "function": {"name": choice}}
        return "auto"
